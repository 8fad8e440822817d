"""The stage → report contract (`identifiable.report.tables`): the report reads each stage's
tables through a dataclass, so a renamed or missing table is one error naming the stage and
the table, never a silently empty figure.

The results are those of a real smoke-budget run on the tiny BERT, caught on their way to
`write_report`, so the test also proves that the stages hand over every table the report
reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.corpora import small_corpus
from identifiable.errors import IdentifiableError
from identifiable.report.document import write_report
from identifiable.report.tables import (
    CONTRACTS,
    AttentionStageTables,
    CertifyStageTables,
    StageTables,
)

EVERY_TABLE = [(c, name) for c in CONTRACTS for name in c.names()]


@pytest.fixture(scope="module")
def run(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """model, results and settings of one smoke run, as reproduce passes them."""
    import identifiable.runs.reproduce as reproduction

    seen: dict[str, Any] = {}
    real = reproduction.write_report

    def spy(out: Path, model: Any, results: Any, settings: Any) -> Any:
        seen.update(model=model, results=results, settings=settings)
        return real(out, model, results, settings)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reproduction, "write_report", spy)
        out = tmp_path_factory.mktemp("run") / "report"
        reproduction.reproduce(
            tiny_model("bert"), small_corpus(), out, budget="smoke", progress=False
        )
    assert (out / "index.html").exists()
    return seen


def _renamed(results: dict[str, Any], stage: str, table: str) -> dict[str, Any]:
    tables = dict(results[stage])
    tables[table + "_renamed"] = tables.pop(table)
    return {**results, stage: tables}


def test_the_unchanged_results_render(run: dict[str, Any], tmp_path: Path) -> None:
    assert {c.STAGE for c in CONTRACTS} <= set(run["results"])
    files, summary = write_report(tmp_path, run["model"], run["results"], run["settings"])
    assert (tmp_path / "index.html").exists() and files
    # every table is written, the beyond-the-paper ones included
    assert {"fig2a_fits", "fig34_estimator", "mixing_summary", "certify_rows"} <= set(
        summary["tables"]
    )
    assert {"posterior_rows", "posterior_by_layer", "posterior_by_length"} <= set(summary["tables"])
    for name in summary["tables"]:
        assert (tmp_path / "tables" / f"{name}.csv").exists(), name


@pytest.mark.parametrize(
    ("contract", "table"), EVERY_TABLE, ids=[f"{c.STAGE}.{t}" for c, t in EVERY_TABLE]
)
def test_a_renamed_table_raises_naming_stage_and_table(
    run: dict[str, Any], tmp_path: Path, contract: type[StageTables], table: str
) -> None:
    results = _renamed(run["results"], contract.STAGE, table)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(
        IdentifiableError, match=f"stage '{contract.STAGE}' gave no table '{table}'"
    ):
        write_report(out, run["model"], results, run["settings"])
    assert not any(out.iterdir()), "a refused report wrote files"


def test_a_missing_paper_stage_raises_and_a_missing_beyond_stage_is_left_out(
    run: dict[str, Any], tmp_path: Path
) -> None:
    without = {k: v for k, v in run["results"].items() if k != AttentionStageTables.STAGE}
    with pytest.raises(IdentifiableError, match="the results hold no stage 'attention'"):
        AttentionStageTables.of(without)
    assert CertifyStageTables.optional(without) is not None
    no_certify = {k: v for k, v in run["results"].items() if k != CertifyStageTables.STAGE}
    assert CertifyStageTables.optional(no_certify) is None
    write_report(tmp_path, run["model"], no_certify, run["settings"])
    assert (tmp_path / "index.html").exists()
    assert not (tmp_path / "tables" / "certify_rows.csv").exists()


def test_of_returns_the_stage_tables_themselves(run: dict[str, Any]) -> None:
    att = AttentionStageTables.of(run["results"])
    assert att.by_length is run["results"]["attention"]["by_length"]
    assert AttentionStageTables.names() == ("by_length", "by_layer", "to_tokens", "output_change")
