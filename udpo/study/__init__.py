"""The study layer: methods x seeds trained on one budget, each finished run recorded, the tables built from
the records alone (``udpo study PLAN.yaml``; ``udpo compare --config PLAN.yaml`` by its earlier name).

Its one entry point is :func:`study` (:mod:`udpo.study.main`), what the command runs. The modules, in the
order the data flows:

- :mod:`udpo.study.plan`: the plan (:class:`CompareConfig`), the methods (:data:`METHODS`), the budget
  every method shares, and :func:`load_plan`, which checks a plan before anything heavy loads;
- :mod:`udpo.study.runner`: trains the runs not yet done (:func:`run_compare`), records each as it finishes,
  shows which are done (:func:`format_progress`), writes the tables (:func:`write_results`);
- :mod:`udpo.study.executor`: what runs the runs, one interface: :mod:`udpo.study.workers`, several
  processes sharing them on this machine (``--workers K``), or :mod:`udpo.study.ray_executor`, one Ray
  task each on a cluster (``--ray``);
- :mod:`udpo.study.record`: a finished run's committed record (:class:`RunRecord`);
- :mod:`udpo.study.tables`: every table and figure from the records (``seed_changes.png`` drawn by
  :mod:`udpo.study.seed_change_plot`);
- :mod:`udpo.study.regrade`: a recorded debate graded again by today's grader and vote (``--grader
  current``), and :mod:`udpo.study.grader_comparison`: those tables beside the tables as recorded;
- :mod:`udpo.study.sample_size`: the blind sample-size rule (``--sample-size``) on the pooled within-arm
  sd and the t-test's power of :mod:`udpo.study.power`.

Layout of ``output_dir`` (the run folders, on the machine that trains)::

    <method>/seed_<s>/        a training run (resumable: a killed study resumes it from its checkpoint)
    <method>/seed_<s>/done.json   written when the run finished

and of ``results_dir`` (default: ``output_dir``; a study's is a folder meant to be committed)::

    runs/<method>_seed<s>/    the run's record, written as it finishes (:mod:`udpo.study.record`):
                              its evaluations, metrics and calibration, compressed. A run with a record is
                              done, whether or not its run folder is still there; the tables read the
                              records alone
    table.md, table.csv       accuracy, U_intra / U_inter / U_sys and the consensus-on-wrong guard per method:
                              mean over seeds [95% CI, each seed's questions resampled]; when the seeds share
                              their test problems, each metric's change per seed with the t-interval and the
                              seeds x problems bootstrap; per run, the training diagnostics
    seed_changes.png          that second table as a picture (only when the seeds share their problems)
    runs.csv, budget.csv      each run's training diagnostics; debates, optimizer steps, generated tokens,
                              warm-up debates per run
    results.json              everything above, with the change of each metric over Standard MAD
    diagnosis/                ``udpo diagnose`` of the final evaluations: gains by U_sys level (Figure 5)
    forms.csv                 each agent's answer forms and echo rate (every turn read again)
    regraded/                 the same files with every debate re-graded (``--tables-only``, whose
                              default grader is ``current``), and comparison.md: both graders side by side

Training never imports this package (tests/test_import_boundaries.py): the study runs training, not the
other way.
"""

from udpo.study.main import study
from udpo.study.plan import METHODS, CompareConfig, load_plan
from udpo.study.record import RunRecord
from udpo.study.runner import format_progress, run_compare, write_results
from udpo.study.sample_size import blind_sample_size

__all__ = [
    "METHODS",
    "CompareConfig",
    "RunRecord",
    "blind_sample_size",
    "format_progress",
    "load_plan",
    "run_compare",
    "study",
    "write_results",
]
