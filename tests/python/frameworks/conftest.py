"""The framework tests run only in the frameworks environment (build/venv-frameworks,
tools/scripts/frameworks_env.sh; ctest label `frameworks`): under the project's own venv
(the `python_tests` run of tests/python) this directory is not collected."""
import os

if os.environ.get("HSDP_FRAMEWORKS_TESTS") != "1":
    collect_ignore_glob = ["*"]
