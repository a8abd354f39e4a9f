package escrow

import (
	"slices"
	"testing"
)

// drive is the driver's side of a request that several limits decide
// together (Decide's steps), with one bounded limit here: peek, decide the
// whole request — denied if elsewhereDenies — then count it as admitted or
// as demand only.
func drive(t *testing.T, l *Ledger, now int64, key string, spec Spec, hits int64, elsewhereDenies bool) (admitted bool, room int64) {
	t.Helper()
	_, room = l.Decide(now, key, spec, 0)
	admitted = hits <= room && !elsewhereDenies
	if admitted {
		if ok, rem := l.Decide(now, key, spec, hits); !ok || rem != room-hits {
			t.Fatalf("Decide after a peek with room %d = %v, %d; want true, %d", room, ok, rem, room-hits)
		}
	} else {
		l.Request(now, key, spec, hits)
	}
	return admitted, room
}

// A request denied by another limit while this one had room counts as
// demand (R) here, never as admitted (C), and R is published: it is what
// rebalancing follows.
func TestRequestProtocol(t *testing.T) {
	spec := Spec{Limit: L100, Window: sec} // a holds a third: room for 33
	for _, tc := range []struct {
		name            string
		before          int64 // hits a admitted before the request
		hits            int64
		elsewhereDenies bool
		wantAdmitted    bool
		wantRoom        int64  // the peek's remaining
		wantC, wantR    uint64 // a's counters after the request
	}{
		{"admitted everywhere: C and R grow", 0, 10, false, true, 33, 10, 10},
		{"denied elsewhere with room here: R grows, C does not", 0, 10, true, false, 33, 0, 10},
		{"denied elsewhere after use: C stays", 20, 10, true, false, 13, 20, 30},
		{"no room here: denied, R grows as a denying Decide would", 30, 10, false, false, 3, 30, 40},
		{"no room here and denied elsewhere", 30, 10, true, false, 3, 30, 40},
		{"exactly the room, admitted", 3, 30, false, true, 30, 33, 33},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, c := trio(t, 0)
			if tc.before > 0 {
				if ok, _ := a.Decide(t1, "k", spec, tc.before); !ok {
					t.Fatalf("setup: %d hits denied", tc.before)
				}
			}
			a.Delta(t1)
			// A peek alone counts nothing and publishes nothing.
			if _, room := a.Decide(t1, "k", spec, 0); room != tc.wantRoom {
				t.Fatalf("peek: room %d, want %d", room, tc.wantRoom)
			}
			if _, items := a.Delta(t1); len(items) != 0 {
				t.Fatalf("a peek published %v", items)
			}
			admitted, room := drive(t, a, t1, "k", spec, tc.hits, tc.elsewhereDenies)
			if admitted != tc.wantAdmitted || room != tc.wantRoom {
				t.Fatalf("admitted %v with room %d; want %v with %d", admitted, room, tc.wantAdmitted, tc.wantRoom)
			}
			n, items := a.Delta(t2)
			if tc.hits > room {
				// Without room here, Request counts what a denying Decide does.
				twin, _, _ := trio(t, 0)
				twin.Decide(t1, "k", spec, tc.before)
				if ok, _ := twin.Decide(t1, "k", spec, tc.hits); ok {
					t.Fatal("twin admitted past its room")
				}
				if _, want := twin.Own(t2); !slices.Equal(items, want) {
					t.Fatalf("Request published %v; a denying Decide publishes %v", items, want)
				}
			}
			var gotC, gotR uint64
			for _, it := range items {
				switch it.Kind {
				case Count:
					gotC = it.Value
				case Requested:
					gotR = it.Value
				default:
					t.Fatalf("Delta published %v", it)
				}
			}
			if gotC != tc.wantC || gotR != tc.wantR {
				t.Fatalf("Delta published C=%d R=%d (%v); want C=%d R=%d", gotC, gotR, items, tc.wantC, tc.wantR)
			}
			// The demand reaches the others, who give a allowance toward it.
			for _, l := range []*Ledger{b, c} {
				if err := l.Apply(n, items); err != nil {
					t.Fatal(err)
				}
				if g := l.Rebalance(t3); len(g) != 2 {
					t.Fatalf("%s gave %v toward a's demand, want a give now and one for the next window", l.Self(), g)
				}
			}
		})
	}
}

// Request counts nothing for no hits, negative hits or an invalid spec, and
// a peek never counts.
func TestRequestCountsNothing(t *testing.T) {
	a, _, _ := trio(t, 0)
	spec := Spec{Limit: L100, Window: sec}
	a.Request(t1, "k", spec, 0)
	a.Request(t1, "k", spec, -5)
	a.Request(t1, "k", Spec{Limit: 0, Window: sec}, 5)
	a.Request(t1, "k", Spec{Limit: 1, Window: 0}, 5)
	a.Decide(t1, "k", spec, 0)
	if _, items := a.Own(t1); len(items) != 0 {
		t.Fatalf("counted %v", items)
	}
}

// Wanted says so once when a replica holding allowance it has not used and
// does not need is heard of demand elsewhere — when the demand appears, not
// only once it is denied — and for allowance that arrives beyond its own
// demand; not when what it holds matches its own demand, not when it has
// nothing to spare, and not for a window that is over.
func TestWanted(t *testing.T) {
	spec := Spec{Limit: L100, Window: sec} // each holds a third
	a, b, c := trio(t, 0)
	if ok, _ := b.Decide(t1, "k", spec, 5); !ok { // served, but b's demand is all there is
		t.Fatal("b denied 5 of its 33")
	}
	send(t, t1, b, a)
	if !a.Wanted() {
		t.Fatal("a, idle with a third unused, did not want to give to b, which asks")
	}
	if a.Wanted() {
		t.Fatal("Wanted said so twice for one hearing")
	}
	send(t, t1, b, a)
	if a.Wanted() {
		t.Fatal("a wanted to give again when b's demand had not grown")
	}
	if ok, _ := c.Decide(t1, "k", spec, 33); !ok { // c spends its whole third
		t.Fatal("c denied its own third")
	}
	send(t, t1, b, c)
	if c.Wanted() {
		t.Fatal("c, with nothing to spare, wanted to give")
	}

	// Demand as large at a as at b: a's target is a half, it holds a
	// third, and it keeps it. Once c gives a its third (c is idle), a
	// holds two thirds against a target of a half: it wants to give b the
	// rest.
	a, b, c = trio(t, 0)
	for _, l := range []*Ledger{a, b} {
		if ok, _ := l.Decide(t1, "k", spec, 10); !ok {
			t.Fatal("denied 10 of a third")
		}
	}
	send(t, t1, b, a)
	if a.Wanted() {
		t.Fatal("a, demanded of as much as b, wanted to give b its third")
	}
	send(t, t1, a, c)
	if !c.Wanted() {
		t.Fatal("c, idle, did not want to give to a")
	}
	for _, it := range c.Rebalance(t1) {
		if it.To == "a" {
			if err := a.Apply(News{From: "c", SentAt: t1}, []Item{it}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !a.Wanted() {
		t.Fatalf("a, given beyond its half (holds %d of %d), did not want to give b the rest", a.Held("k", spec, 0), a.Scale())
	}

	// A window that is over wants nothing, whatever is heard of it.
	a, b, _ = trio(t, 0)
	b.Decide(t1, "k", spec, 5)
	a.Decide(t1+2*sec, "other", spec, 1)
	send(t, t1, b, a)
	if a.Wanted() {
		t.Fatal("a wanted to give of a window that ended a second ago")
	}
}
