import pytest

from mpirl.transport.topology import (
    LayoutError,
    format_table,
    layout,
    placement_warnings,
    site_sizes,
)


def test_default_nine_ranks():
    places = layout(9, 1)
    assert [p.role for p in places] == ["learner", "buffer"] + ["actor"] * 7
    assert [p.index for p in places if p.role == "actor"] == list(range(7))
    assert all(p.site == 0 for p in places[1:])


def test_two_sites_contiguous():
    places = layout(8, 2)  # 1 learner, 2 buffers, 5 actors: 3 + 2
    assert site_sizes(8, 2) == [3, 2]
    assert [(p.role, p.site) for p in places] == [
        ("learner", -1),
        ("buffer", 0),
        ("actor", 0),
        ("actor", 0),
        ("actor", 0),
        ("buffer", 1),
        ("actor", 1),
        ("actor", 1),
    ]


@pytest.mark.parametrize("n, b", [(2, 1), (1, 1), (4, 2), (9, 5)])
def test_impossible_layouts(n, b):
    with pytest.raises(LayoutError, match=f"{n} MPI ranks"):
        layout(n, b)


def test_table_and_warnings():
    places = layout(4, 1)
    hosts = ["cloud", "edge", "edge", "other"]
    assert "buffer" in format_table(places, hosts)
    w = placement_warnings(places, hosts, link_emulated=False)
    assert any("does not share a host" in x for x in w)
    same = ["h"] * 4
    assert any("not long-haul" in x for x in placement_warnings(places, same, False))
    assert not placement_warnings(places, same, True)
