from gpufleet.perf.step_time import LinearStepTimeModel, StepBatch
from gpufleet.tokenizer import Tokenizer, apply_chat_template, block_hashes


def test_generated_text_retokenizes_to_the_same_count() -> None:
    tok = Tokenizer()
    ids = tok.word_ids_for_seed(7, 50)
    text = "".join(tok.token_text(i) for i in ids)
    assert tok.encode(text) == ids
    assert tok.count(text) == 50


def test_unknown_words_get_stable_ids() -> None:
    tok = Tokenizer()
    a = tok.encode("hello, wörld! 12345")
    assert a == Tokenizer().encode("hello, wörld! 12345")
    assert all(tok.first_word_id <= i < tok.vocab_size for i in a)


def test_equal_prefixes_give_equal_block_hashes() -> None:
    tok = Tokenizer()
    shared = " ".join(tok.vocab[i] for i in tok.word_ids_for_seed(1, 40))
    a = tok.encode(apply_chat_template([{"role": "user", "content": shared + " one"}]))
    b = tok.encode(apply_chat_template([{"role": "user", "content": shared + " two"}]))
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert ha[:2] == hb[:2]
    assert len(ha) == len(a) // 16


def test_linear_step_time_model() -> None:
    m = LinearStepTimeModel(base_s=0.01, per_token_s=0.001)
    assert m.step_time_s(StepBatch()) == 0.0
    assert (
        m.step_time_s(StepBatch(prefill_tokens=(10,), prefill_context_tokens=(0,), num_decode=5))
        == 0.01 + 0.015
    )


def test_lone_surrogates_are_tokenized_not_refused() -> None:
    """JSON allows a lone surrogate ("\\ud800"); UTF-8 cannot encode one. The replica
    answered 500 to such a prompt before (found by the gateway's fuzz corpus)."""
    tok = Tokenizer()
    ids = tok.encode("a \ud800 b\udfffc")
    assert len(ids) == 3 and ids == tok.encode("a \ud800 b\udfffc")
