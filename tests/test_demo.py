from kformer.demo import demo
from kformer.train.options import TrainOptions


def test_demo_trains_then_reports_scores_and_translations(tmp_path, corpus_tsv, capsys):
    out = str(tmp_path / "demo")
    options = TrainOptions(data=corpus_tsv, vocab_size=1200, verbose=0)
    result = demo(out, "tiny", minutes=0.05, options=options)
    printed = capsys.readouterr().out
    assert (
        "training speed:" in printed and "trained " in printed and "(time budget of 0.05 min used)" in printed
    )
    assert (
        f"BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  ({result['sentences']} sentences, beam 4)"
        in printed
    )
    source, references, hypothesis = result["examples"][0]
    assert f"  {source}\n    ref: {references[0]}\n    out: {hypothesis}\n" in printed
    assert printed.rstrip().endswith(f'translate more with: kformer translate --model {out} "你好。"')
    again = demo(out, "tiny", minutes=0.05, options=options)  # the budget is spent
    assert "trained" in capsys.readouterr().out and again["bleu"] == result["bleu"]
