import numpy as np
import pytest

from mpirl.agent.nstep import NStep


def test_hand_computed_episode_terminated():
    """n=3, gamma=0.5, rewards 1,2,3,4 then termination."""
    ns = NStep(3, 0.5)
    out = []
    for t, r in enumerate([1.0, 2.0, 3.0, 4.0]):
        out += ns.push(np.array([t]), t % 2, r, np.array([t + 1]), t == 3, False, q_sa=10 + t)
    assert [int(o[0][0]) for o in out] == [0, 1, 2, 3]
    # s0: 1 + .5*2 + .25*3 = 2.75, bootstrap from s3 with discount .125
    assert out[0][2] == pytest.approx(2.75) and out[0][4] == pytest.approx(0.125)
    assert int(out[0][3][0]) == 3 and out[0][5] == 10
    # s1: 2 + .5*3 + .25*4 = 4.5; the episode terminated inside the window -> discount 0
    assert out[1][2] == pytest.approx(4.5) and out[1][4] == 0.0 and int(out[1][3][0]) == 4
    assert out[2][2] == pytest.approx(3 + 2.0) and out[2][4] == 0.0
    assert out[3][2] == pytest.approx(4.0) and out[3][4] == 0.0


def test_truncation_bootstraps():
    ns = NStep(3, 0.9)
    out = ns.push("a", 0, 1.0, "b", False, False)
    assert out == []
    out = ns.push("b", 1, 1.0, "c", False, True)  # time limit: bootstrap from "c"
    assert [o[0] for o in out] == ["a", "b"]
    assert out[0][2] == pytest.approx(1.9) and out[0][4] == pytest.approx(0.81)
    assert out[1][2] == pytest.approx(1.0) and out[1][4] == pytest.approx(0.9)
    assert all(o[3] == "c" for o in out)


def test_n1_is_one_step():
    ns = NStep(1, 0.99)
    (o,) = ns.push("s", 1, 2.0, "s2", False, False)
    assert o[2] == 2.0 and o[4] == pytest.approx(0.99)


def test_bad_n():
    with pytest.raises(ValueError, match="n_step=0"):
        NStep(0, 0.9)
