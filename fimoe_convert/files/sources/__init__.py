"""SRC: a local folder or Hub snapshot (`local`), the Hub itself (`hub`: resolve, download, headers without
the weights), `--stream` (`stream`) and the resuming HTTP range reads its shards arrive by (`http_range`)."""
