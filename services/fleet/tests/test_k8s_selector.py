import re

import pytest

from switchyard.fleet.k8s.selector import parse_selector

LABELS = {"app": "sglang", "pool": "prefill", "tier": "", "example.com/zone": "a"}


class TestMatching:
    @pytest.mark.parametrize(
        "text, expected",
        [
            ("", True),
            ("app=sglang", True),
            ("app==sglang", True),
            ("app=vllm", False),
            ("app!=vllm", True),
            ("missing!=x", True),  # != matches objects without the label
            ("app", True),
            ("missing", False),
            ("!missing", True),
            ("!app", False),
            ("pool in (prefill,decode)", True),
            ("pool in (decode)", False),
            ("pool notin (decode)", True),
            ("missing notin (x)", True),
            ("missing in (x)", False),
            ("tier=", True),  # an empty value is a value
            ("example.com/zone=a", True),
            ("app=sglang,pool=prefill", True),
            ("app=sglang, pool=decode", False),
            ("  app = sglang ,pool in ( prefill , decode ) ", True),
        ],
    )
    def test_like_the_api_server(self, text, expected):
        assert parse_selector(text).matches(LABELS) is expected

    def test_no_labels_at_all(self):
        assert parse_selector("app!=x,!y").matches(None)
        assert not parse_selector("app").matches(None)


class TestErrors:
    @pytest.mark.parametrize(
        "text, problem",
        [
            ("app=sglang,", "ends with a comma"),
            ("app in sglang", "parenthesized"),
            ("app in ()", "empty value list"),
            ("app in (a b)", "expected , or )"),
            ("app sglang", "unexpected"),
            ("app=sglang pool=x", "separated by commas"),
            ("-app=x", "label key"),
            ("UPPER.example/x=1", "prefix"),
            ("app=" + "v" * 64, "label value"),
            ("app=-x", "label value"),
            ("!", "ends early"),
            ("app in (a", "ends early"),
        ],
    )
    def test_names_the_problem(self, text, problem):
        with pytest.raises(ValueError, match=re.escape(problem)):
            parse_selector(text)
