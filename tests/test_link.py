import pytest

from mpirl.config import Config, ConfigError
from mpirl.link import PROFILES, LinkModel, LinkProfile, resolve_profile


def test_bandwidth_serializes_back_to_back():
    m = LinkModel(LinkProfile(latency_s=0.01, rate_bps=8e6))  # 1 MB/s
    assert m.departure(0.0, 1000) == pytest.approx(0.001)
    assert m.departure(0.0, 1000) == pytest.approx(0.002)  # queued behind the first
    assert m.departure(1.0, 1000) == pytest.approx(1.001)  # idle link starts at once
    assert m.busy_time == pytest.approx(0.003)


def test_latency_and_fifo_with_jitter():
    m = LinkModel(LinkProfile(latency_s=0.01, jitter_s=0.005), seed=1)
    times = [m.delivery(t * 1e-4) for t in range(100)]
    assert times == sorted(times)
    assert all(t >= 0.005 for t in times)
    assert LinkModel(LinkProfile(latency_s=0.02)).delivery(1.0) == pytest.approx(1.02)


def test_profiles_and_overrides():
    assert not PROFILES["none"].emulated
    fiber = PROFILES["fiber-10km-25g"]
    assert fiber.latency_s == pytest.approx(50e-6) and fiber.rate_bps == 25e9
    p = resolve_profile(Config(link="wan-100m-30ms", latency_ms=5.0))
    assert p.latency_s == pytest.approx(0.005) and p.rate_bps == 100e6
    with pytest.raises(ConfigError, match="link='dialup'"):
        resolve_profile(Config(link="dialup"))
    with pytest.raises(ConfigError, match="bandwidth_mbps=0"):
        resolve_profile(Config(bandwidth_mbps=0.0))
