package escrow

import "testing"

// A replica out of allowance has a give coming exactly while another
// replica holds allowance it does not need, and nothing once the give has
// arrived and been used, or when the others need what they hold.
func TestComing(t *testing.T) {
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
		// b and c hold 66 that nobody else asked for: a's demand is all of it.
		if got := a.Coming(t1, "k", spec); got < 60 || got > 67 {
			t.Fatalf("Coming = %d, want about the 66 b and c hold", got)
		}
		// b and c hear a's demand and give; once a hears the gives it has
		// that room, and nothing more is coming.
		send(t, t2, a, b, c)
		if len(b.Rebalance(t2)) == 0 || len(c.Rebalance(t2)) == 0 {
			t.Fatal("b and c gave nothing to a's demand")
		}
		send(t, t2, b, a)
		send(t, t2, c, a)
		_, room := a.Decide(t2, "k", spec, 0)
		if room < 60 {
			t.Fatalf("after the gives a has room for %d, want about 66", room)
		}
		if got := a.Coming(t2, "k", spec); got > room+1 {
			t.Fatalf("Coming = %d after the gives arrived, want no more than the room %d", got, room)
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
		if got := a.Coming(t1, "k", spec); got != 0 {
			t.Fatalf("b and c used what they hold, yet %d hits are coming to a", got)
		}
	})
	t.Run("silent holders: nothing is coming", func(t *testing.T) {
		a, _, _ := trio(t, 0)
		a.Decide(t1, "k", spec, 33)
		a.Decide(t1, "k", spec, 1)
		if got := a.Coming(t1, "k", spec); got != 0 {
			t.Fatalf("a never heard b or c, yet %d hits are coming", got)
		}
	})
}
