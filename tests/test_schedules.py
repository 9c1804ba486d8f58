"""The learning-rate schedules against their formulas."""

import json

import pytest
from conftest import python_lines

from kformer.train.recipe import recipe
from kformer.train.schedules import BudgetSchedule, TransformerSchedule, budget_warmup


def test_schedule_follows_the_paper():
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    for step in (1, 100, 4000, 20000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)  # optimizer steps count from 0


def test_budget_schedule_warms_up_linearly_then_decays_to_zero():
    schedule = BudgetSchedule(peak=1e-3, warmup_steps=10, total_steps=110)
    lr = [float(schedule(i)) for i in range(120)]  # optimizer iterations 0, 1, ...
    assert lr[0] == pytest.approx(1e-4) and lr[4] == pytest.approx(5e-4)
    assert max(lr) == pytest.approx(1e-3) and lr.index(max(lr)) == 9  # the peak ends the warm-up
    assert lr[59] == pytest.approx(1e-3 * 51 / 100)  # halfway down the linear decay
    assert lr[109] == pytest.approx(1e-3 / 100) and lr[110:] == [0.0] * 10  # the last step, then nothing
    schedule.set(20, 220)  # the budget callback re-sizes it in place
    assert float(schedule(19)) == pytest.approx(1e-3) and float(schedule(219)) == pytest.approx(1e-3 / 200)


def test_budget_schedule_holds_the_peak_before_its_decay_fraction():
    schedule = BudgetSchedule(peak=1e-3, warmup_steps=10, total_steps=100, decay_fraction=0.3)
    lr = [float(schedule(i)) for i in range(100)]
    assert lr[9:70] == pytest.approx([1e-3] * 61)  # held from the end of the warm-up to step 70
    assert lr[84] == pytest.approx(1e-3 * 16 / 30) and lr[99] == pytest.approx(1e-3 / 30)


def test_warmup_is_a_fraction_of_the_estimated_steps_capped_by_the_recipe():
    small = recipe("small", warmup_fraction=0.05, warmup_steps=300)
    assert [budget_warmup(small, total) for total in (10, 1000, 4000, 10**6)] == [1, 50, 200, 300]


# Under a tf.distribute strategy (here two CPU replicas) the step counts are distributed variables.
DISTRIBUTED_SCRIPT = r"""
import json
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from kformer.train.schedules import BudgetSchedule
with tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")]).scope():
    schedule = BudgetSchedule(peak=1e-3, warmup_steps=10, total_steps=110)
print(json.dumps({"describe": schedule.describe(), "config": schedule.get_config()}))
"""


def test_budget_schedule_describes_itself_under_a_distribution_strategy():
    report = json.loads(python_lines(DISTRIBUTED_SCRIPT)[-1])
    assert report["describe"].startswith("linear warm-up over 10 steps to 0.001")
    assert report["config"] == {
        "peak": 1e-3,
        "warmup_steps": 10.0,
        "total_steps": 110.0,
        "decay_fraction": 1.0,
    }
