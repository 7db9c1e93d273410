"""Share 1 of the labs, each run and used in a real browser (lab_run.py says what is checked)."""

import pytest
from lab_run import notebooks, run_lab

LABS = notebooks(1)


@pytest.mark.parametrize("notebook", LABS, ids=[p.stem for p in LABS])
def test_lab_runs_and_responds_in_a_real_browser(notebook, jupyter, browser, tmp_path):
    run_lab(notebook, jupyter, browser, tmp_path)
