"""A stop string that completes inside a delta of several ids: the text ends where it does
when the ids come one by one, and the ids after the one it completed in are its overrun."""

from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.tokenizer import TokenizerBundle

TEXT = "The grain cars wait on siding four until the coal train has passed."


def one_by_one(bundle: TokenizerBundle, ids: list[int], stop: str) -> tuple[str, int]:
    """The text and how many ids it took, fed a token per delta."""
    choice = ChoiceOutput(0, bundle, [], [stop])
    out = []
    for k, token_id in enumerate(ids):
        out.append(choice.text([token_id]))
        if choice.done:
            return "".join(out), k + 1
    raise AssertionError("the stop string never completed")


def test_a_stop_inside_a_delta_ends_it_where_single_tokens_do(bundle: TokenizerBundle) -> None:
    ids = bundle.tokenizer.encode(TEXT, add_special_tokens=False).ids
    for stop in ("siding", "four until", " coal", "d."):
        expected, used = one_by_one(bundle, ids, stop)
        choice = ChoiceOutput(0, bundle, [], [stop])
        assert choice.text(ids) == expected, stop
        assert choice.done and choice.finish_reason == "stop"
        assert choice.overrun == len(ids) - used, stop


def test_a_delta_without_its_stop_is_whole(bundle: TokenizerBundle) -> None:
    ids = bundle.tokenizer.encode(TEXT, add_special_tokens=False).ids
    choice = ChoiceOutput(0, bundle, [], ["tender"])
    assert choice.text(ids) + choice.finish("length") == TEXT
    assert choice.overrun == 0
