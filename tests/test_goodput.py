"""Goodput: the accounting on hand-made attempt records (expected values worked out by hand), the records an
attempt keeps in its workdir, and a pre-training run killed past its checkpoint and resumed."""
import json

import helpers as tt
import pytest

from bertjax.core import goodput


def attempt(n, start, end, ended="finished", start_step=0, step=10, saved=None, at_save=0.0, **seconds):
  """One attempt's last record: started at `start`, last written at `end`, `seconds` by category (default 0)."""
  r = {"attempt": n, "start_time": start, "time": end, "start_step": start_step, "step": step,
       "saved_step": step if saved is None else saved, "productive_at_save_s": at_save, "ended": ended}
  r.update({f"{k}_s": float(seconds.get(k, 0.0)) for k in goodput.TIMED})
  return r


def test_one_finished_attempt_splits_its_wall_clock():
  # 100 s: 60 productive, startup 12, compile 5, data 4, save 3, eval 6; the 10 s left are `other`.
  s = goodput.summarise([attempt(1, 100.0, 200.0, startup=12, compile=5, productive=60, data_wait=4,
                                 checkpoint_save=3, evaluation=6)])
  assert s["elapsed_s"] == pytest.approx(100.0)
  assert s["goodput"] == pytest.approx(0.60)
  assert s["badput"]["other"] == pytest.approx(10.0)
  assert s["badput"]["preemption"] == 0.0 and s["lost_steps"] == 0
  assert sum(s["fractions"].values()) == pytest.approx(1.0)
  assert goodput.largest_badput(s) == ("startup", pytest.approx(0.12))


def test_a_killed_attempt_loses_its_steps_past_the_checkpoint_and_the_gap_to_the_restart():
  # Attempt 1 reached step 40 (70 s of steps, 50 s of them up to its checkpoint at 30) and was killed, its last
  # record at t=100; attempt 2 starts at t=130 from step 30. Lost: steps 31..40 (20 s) and the 30 s gap.
  killed = attempt(1, 0.0, 100.0, ended=None, step=40, saved=30, at_save=50.0, startup=10, compile=5, productive=70)
  resumed = attempt(2, 130.0, 230.0, start_step=30, step=60, startup=8, compile=2, checkpoint_restore=5,
                    productive=80)
  s = goodput.summarise([killed, resumed])
  assert s["lost_steps"] == 10
  assert s["lost_progress_s"] == pytest.approx(20.0) and s["restart_gap_s"] == pytest.approx(30.0)
  assert s["elapsed_s"] == pytest.approx(230.0)          # 100 + 30 + 100
  assert s["productive_s"] == pytest.approx(130.0)       # 70 + 80 - 20
  assert s["badput"]["preemption"] == pytest.approx(50.0)
  assert s["badput"]["other"] == pytest.approx(20.0)     # 200 s of attempts, 180 s counted
  assert s["badput"]["startup"] == pytest.approx(18.0)
  assert s["goodput"] == pytest.approx(130.0 / 230.0)
  assert sum(s["fractions"].values()) == pytest.approx(1.0)
  assert goodput.line(s) == ("goodput 56.5% of 3m50s over 2 attempts (largest badput: preemption 21.7%; "
                             "10 steps lost)")


def test_a_resume_below_the_checkpoint_loses_the_mean_step_time_of_each_step_run_again():
  # The checkpoint at 30 was unreadable and attempt 2 resumed from 20: 20 of attempt 1's 40 steps (80 s) ran again.
  s = goodput.summarise([attempt(1, 0.0, 100.0, ended=None, step=40, saved=30, at_save=60.0, productive=80),
                         attempt(2, 100.0, 150.0, start_step=20, step=40, productive=40)])
  assert s["lost_steps"] == 20 and s["lost_progress_s"] == pytest.approx(40.0)
  assert s["productive_s"] == pytest.approx(80.0)


@pytest.mark.parametrize("ended, gap", [("stop_after_steps", 0.0), ("SIGINT", 0.0), ("SIGTERM", 900.0),
                                        (None, 900.0)])
def test_only_a_kill_or_a_preemption_puts_the_wait_for_the_next_attempt_in_the_job(ended, gap):
  s = goodput.summarise([attempt(1, 0.0, 100.0, ended=ended, step=10, productive=100),
                         attempt(2, 1000.0, 1100.0, start_step=10, step=20, productive=100)])
  assert s["elapsed_s"] == pytest.approx(200.0 + gap)
  assert s["restart_gap_s"] == pytest.approx(gap) and s["lost_steps"] == 0
  assert s["goodput"] == pytest.approx(200.0 / (200.0 + gap))


class FakeClock:
  def __init__(self, t):
    self.t = t

  def __call__(self):
    return self.t


def test_an_attempt_keeps_one_cumulative_record_and_the_next_reads_it(tmp_path):
  clock = FakeClock(1000.0)
  r = goodput.Recorder(str(tmp_path), started=990.0, now=clock)
  clock.t = 1004.0
  r.began(0)                                             # 14 s of start-up
  for step, seconds in ((1, 3.0), (2, 1.0), (3, 1.0)):   # the first step compiles
    clock.t += seconds
    r.stepped(step, seconds, first=step == 1)
  r.saved(3)
  clock.t += 2.0
  r.stepped(4, 2.0, first=False)
  r.logged(4)                                            # a local workdir's record is rewritten at each log
  lines = (tmp_path / goodput.FILE).read_text().splitlines()
  assert len(lines) == 1
  rec = json.loads(lines[0])
  assert (rec["attempt"], rec["start_step"], rec["step"], rec["saved_step"], rec["ended"]) == (1, 0, 4, 3, None)
  assert (rec["startup_s"], rec["compile_s"], rec["productive_s"], rec["productive_at_save_s"]) == (14, 3, 4, 2)
  assert rec["time"] == 1011.0
  clock.t = 1025.0
  nxt = goodput.Recorder(str(tmp_path), started=1020.0, now=clock)  # resumes from the checkpoint at 3
  assert nxt.record["attempt"] == 2 and [p["attempt"] for p in nxt.prior] == [1]
  nxt.began(3)
  s = nxt.close(None)
  assert s["lost_steps"] == 1 and s["lost_progress_s"] == pytest.approx(2.0)
  assert s["restart_gap_s"] == pytest.approx(9.0)        # 1011 -> 1020
  assert [r["attempt"] for r in goodput.read(str(tmp_path))] == [1, 2]


@pytest.mark.slow
def test_a_killed_pretraining_run_counts_its_lost_steps_when_resumed(tmp_path, data_dir, monkeypatch):
  """Attempt 1 checkpoints at step 2 and dies at step 4 after its log there, before that step's save (as a kill -9
  would leave it); attempt 2 resumes at 2 and runs 3..5: steps 3 and 4 ran twice, and every second of the job
  is in one category."""
  from bertjax import pretrain
  from bertjax.core import checkpoint

  class Killed(Exception):
    pass

  logged, save = goodput.Recorder.logged, checkpoint.Checkpointer.save

  def dies_at_4(self, step):
    logged(self, step)
    if step == 4:
      raise Killed

  w = str(tmp_path / "w")
  config = tt.small_config(data_dir, num_steps=5)
  config.checkpoint_every, config.eval_every = 2, 0  # no evaluation: the test's time goes to the two attempts
  monkeypatch.setattr(goodput.Recorder, "logged", dies_at_4)

  def committed(self, *args):  # the dying attempt's save of step 2 is finished, as a kill two steps later finds it
    save(self, *args)
    self.wait()
  monkeypatch.setattr(checkpoint.Checkpointer, "save", committed)
  with pytest.raises(Killed):
    pretrain.train_and_evaluate(config, w)
  monkeypatch.setattr(goodput.Recorder, "logged", logged)
  first = goodput.read(w)
  assert [(r["start_step"], r["step"], r["saved_step"], r["ended"]) for r in first] == [(0, 4, 2, None)]
  summary = pretrain.train_and_evaluate(config, w)
  s = summary["goodput"]
  records = goodput.read(w)
  assert [(r["start_step"], r["step"], r["ended"]) for r in records] == [(0, 4, None), (2, 5, "finished")]
  assert records[1]["checkpoint_restore_s"] > 0 and records[1]["compile_s"] > 0
  assert s["lost_steps"] == 2 and s["attempts"] == 2
  assert s["lost_progress_s"] > 0 and s["badput"]["preemption"] >= s["lost_progress_s"] + s["restart_gap_s"] - 1e-9
  assert 0 < s["goodput"] < 1
  assert sum(s["fractions"].values()) == pytest.approx(1.0)
  rows = [r for r in tt.metrics_rows(w) if r["split"] == "goodput"]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # the killed attempt's rows past step 2 replaced
  assert rows[-1]["lost_steps"] == 2 and 0 < rows[-1]["goodput"] < 1
  assert any(p.endswith("goodput.png") for p in summary["plots"])
