"""Cases of tests/files/test_stream.py: REPO converted streamed from the Hub through an empty Hugging Face cache
(`cache`), then the same repo converted offline from a cache holding it (`ref_cache`), and the streamed OUT verified.
Run as a script, it is a worker for flashinfer.moe_ep targets (FlashInfer's SM90 and SM100 kernel trees cannot share
a process, and each costs seconds to import): one case a line on stdin, {"endpoint": the Hub's URL, **convert_both's
keywords} as JSON; one line of JSON on stdout per case, convert_both's answer or {"error": the traceback}."""

import json
import os
import sys
import traceback


def convert_both(repo: str, target: str, out: str, ref: str, cache: str, ref_cache: str, kw: dict) -> dict:
    from fimoe_convert import convert, verify

    before = os.environ.get("HF_HUB_CACHE")
    try:
        os.environ["HF_HUB_CACHE"] = cache  # read at each call, not at huggingface_hub's import
        res = convert(repo, out, target, stream=True, **kw)
        os.environ["HF_HUB_CACHE"] = ref_cache
        convert(repo, ref, target, offline=True, **kw)
    finally:
        if before is None:
            os.environ.pop("HF_HUB_CACHE", None)
        else:
            os.environ["HF_HUB_CACHE"] = before
    return {"bytes_fetched": res.bytes_fetched, "problems": verify(out).problems}


def serve() -> None:
    import huggingface_hub.constants as hf_constants

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the conversion prints (FlashInfer's JIT too) goes to stderr, not into the answers
    for line in sys.stdin:
        case = json.loads(line)
        url = case.pop("endpoint")
        hf_constants.ENDPOINT = url
        hf_constants.HUGGINGFACE_CO_URL_TEMPLATE = url + "/{repo_id}/resolve/{revision}/{filename}"
        try:
            answer = convert_both(**case)
        except Exception:
            answer = {"error": traceback.format_exc()}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
