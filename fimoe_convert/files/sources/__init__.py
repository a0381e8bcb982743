"""SRC: a local folder or Hub snapshot (`local`), the Hub itself (`hub`: resolve, download, headers without
the weights), `--stream` (`stream`) and the one HTTP range reader (`http_range`)."""
