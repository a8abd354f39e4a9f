package escrow

import "testing"

// A replica out of allowance awaits a give exactly while another replica
// holds allowance it does not need, and stops awaiting once the give has
// arrived and been used, or when the others need what they hold.
func TestAwaits(t *testing.T) {
	spec := Spec{Limit: L100, Window: sec} // each holds a third: room for 33 hits at each
	t.Run("idle holders: a give is coming", func(t *testing.T) {
		a, b, c := trio(t, 0)
		send(t, t0, b, a) // a has heard b and c: alive
		send(t, t0, c, a)
		if ok, _ := a.Decide(t1, "k", spec, 33); !ok {
			t.Fatal("a denied its own third")
		}
		if ok, _ := a.Decide(t1, "k", spec, 1); ok {
			t.Fatal("a admitted past its third")
		}
		if !a.Awaits(t1, "k", spec, 1) {
			t.Fatal("b and c hold two thirds they do not need, and a awaits nothing")
		}
		// b and c hear a's demand and give; once a hears the gives it has room.
		send(t, t2, a, b, c)
		if len(b.Rebalance(t2)) == 0 || len(c.Rebalance(t2)) == 0 {
			t.Fatal("b and c gave nothing to a's demand")
		}
		send(t, t2, b, a)
		send(t, t2, c, a)
		if !a.Awaits(t2, "k", spec, 1) {
			t.Fatal("room has arrived: a retry admits, so Awaits must say so")
		}
		if ok, _ := a.Decide(t2, "k", spec, 1); !ok {
			t.Fatal("a denied after the gives arrived")
		}
	})
	t.Run("holders with demand of their own: nothing is coming", func(t *testing.T) {
		a, b, c := trio(t, 0)
		for _, l := range []*Ledger{b, c} {
			if ok, _ := l.Decide(t1, "k", spec, 33); !ok {
				t.Fatalf("%s denied its own third", l.Self())
			}
		}
		a.Decide(t1, "k", spec, 33)
		a.Decide(t1, "k", spec, 1) // denied
		send(t, t1, b, a)
		send(t, t1, c, a)
		if a.Awaits(t1, "k", spec, 1) {
			t.Fatal("b and c used what they hold, yet a awaits a give")
		}
	})
	t.Run("silent holders: nothing is coming", func(t *testing.T) {
		a, _, _ := trio(t, 0)
		a.Decide(t1, "k", spec, 33)
		a.Decide(t1, "k", spec, 1)
		if a.Awaits(t1, "k", spec, 1) {
			t.Fatal("a never heard b or c, yet awaits their gives")
		}
	})
	t.Run("more hits than the limit never fit", func(t *testing.T) {
		a, b, c := trio(t, 0)
		send(t, t0, b, a)
		send(t, t0, c, a)
		a.Decide(t1, "k", spec, 101)
		if a.Awaits(t1, "k", spec, 101) {
			t.Fatal("awaits room for more hits than the limit")
		}
	})
}
