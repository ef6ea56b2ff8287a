"""The escalated environment is an allowlist (policy_service/envclean.py, issue #9 class 5)."""

from __future__ import annotations

from execgate.policy_service.envclean import SAFE_PATH, clean_env


def test_only_plain_base_variables_pass_and_path_is_fixed() -> None:
    env = {
        "TERM": "xterm", "LANG": "en_US.UTF-8", "LC_ALL": "C", "TZ": "Europe/Paris", "USER": "a",
        "HOME": "/home/a", "APT_CONFIG": "/x", "XDG_CONFIG_HOME": "/x", "GIT_DIR": "/x", "PATH": "/x:/usr/bin",
        "TMPDIR": "/x", "SOMETHING_NEW": "1",
    }
    assert clean_env(env) == {"TERM": "xterm", "LANG": "en_US.UTF-8", "LC_ALL": "C", "TZ": "Europe/Paris",
                              "USER": "a", "PATH": SAFE_PATH}


def test_base_variables_that_name_files_are_dropped() -> None:
    env = {"LANG": "/x/locale", "LC_CTYPE": "../../x", "TERM": "/x/terminfo", "TZ": "/x/zone",
           "LANGUAGE": "a\nb", "COLUMNS": "8" * 300}
    assert clean_env(env) == {"PATH": SAFE_PATH}
    assert clean_env({"TZ": ":/etc/localtime"}) == {"PATH": SAFE_PATH}
    assert clean_env({"TZ": "Europe/../../x"}) == {"PATH": SAFE_PATH}


def test_rule_allow_env_adds_variables_and_may_pass_path() -> None:
    env = {"PIP_INDEX_URL": "https://i/simple", "LD_PRELOAD": "/x.so", "PATH": "/opt/bin:/usr/bin", "HOME": "/h"}
    assert clean_env(env, ["PIP_*"]) == {"PIP_INDEX_URL": "https://i/simple", "PATH": SAFE_PATH}
    assert clean_env(env, ["PATH", "HOME"]) == {"PATH": "/opt/bin:/usr/bin", "HOME": "/h"}
    assert clean_env({}, ["PATH"]) == {"PATH": SAFE_PATH}


def test_entries_no_environment_can_hold_are_dropped_even_if_allowed() -> None:
    assert clean_env({"A=B": "1", "": "x", "N": "a\0b"}, ["*"]) == {"PATH": SAFE_PATH}
