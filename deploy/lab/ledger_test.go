package lab

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/simulate"
)

// TestLedgerIsTheOracle: on decisions that do not overlap in time, the
// ledger's over- and under-admissions are exactly the simulator's false
// allows and false denies for the same decisions (simulate.Grade): one rule
// for both.
func TestLedgerIsTheOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	t0 := time.Unix(1_700_000_000, 0)
	const window, limit = 10 * time.Second, 20
	var ds []Decision
	var gs []simulate.Graded
	at := time.Duration(0)
	for range 2000 {
		at += time.Duration(rng.IntN(40)+1) * time.Millisecond // distinct instants, ~4 per window's limit
		d := Decision{Limit: "l", PoP: []string{"a", "b"}[rng.IntN(2)], Send: t0.Add(at), Recv: t0.Add(at), Hits: 1, Allowed: rng.IntN(3) > 0}
		ds = append(ds, d)
		gs = append(gs, simulate.Graded{At: at, Hits: 1, Admitted: d.Allowed})
	}
	fa, fd := simulate.Grade(window, limit, 1, gs)
	var wantOver, wantUnder int64
	for i := range fa {
		if fa[i] {
			wantOver++
		}
		if fd[i] {
			wantUnder++
		}
	}
	var over, under, bounded int64
	for _, r := range Ledger(LedgerLimit{Name: "l", Limit: limit, Window: window, Bounded: true}, ds) {
		over += r.Over
		under += r.Under
		bounded += r.OverBound
	}
	if wantOver == 0 || wantUnder == 0 {
		t.Fatalf("the oracle found %d false allows and %d false denies: the decisions test nothing", wantOver, wantUnder)
	}
	if over != wantOver || under != wantUnder || bounded != over {
		t.Errorf("ledger: over %d (beyond the bound %d), under %d; oracle: false allows %d, false denies %d", over, bounded, under, wantOver, wantUnder)
	}
}

// TestLedgerOverlap grades decisions whose times overlap by every order
// they may have been decided in, and counts per fixed window.
func TestLedgerOverlap(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).Truncate(time.Hour)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	lim := LedgerLimit{Name: "g", Limit: 1, Window: time.Hour, Staleness: 100 * time.Millisecond}
	for _, c := range []struct {
		name                         string
		ds                           []Decision
		over, overBound, under, rows int64
	}{
		{"two admissions that overlap: neither is certainly over", []Decision{
			{PoP: "a", Send: ms(0), Recv: ms(10), Allowed: true},
			{PoP: "b", Send: ms(5), Recv: ms(15), Allowed: true},
		}, 0, 0, 0, 1},
		{"one after the other at one PoP: over, and beyond the bound", []Decision{
			{PoP: "a", Send: ms(0), Recv: ms(10), Allowed: true},
			{PoP: "a", Send: ms(20), Recv: ms(30), Allowed: true},
		}, 1, 1, 0, 1},
		{"one after the other at two PoPs within the staleness: over, within the bound", []Decision{
			{PoP: "a", Send: ms(0), Recv: ms(10), Allowed: true},
			{PoP: "b", Send: ms(20), Recv: ms(30), Allowed: true},
		}, 1, 0, 0, 1},
		{"at two PoPs past the staleness: beyond the bound", []Decision{
			{PoP: "a", Send: ms(0), Recv: ms(10), Allowed: true},
			{PoP: "b", Send: ms(500), Recv: ms(510), Allowed: true},
		}, 1, 1, 0, 1},
		{"a denial before the only admission: under", []Decision{
			{PoP: "a", Send: ms(0), Recv: ms(10), Allowed: false},
			{PoP: "b", Send: ms(20), Recv: ms(30), Allowed: true},
		}, 0, 0, 1, 1},
		{"a denial overlapping the admission: not certainly under", []Decision{
			{PoP: "a", Send: ms(0), Recv: ms(10), Allowed: true},
			{PoP: "b", Send: ms(5), Recv: ms(15), Allowed: false},
		}, 0, 0, 0, 1},
		{"the next hour's window has room again: two rows, the denial under", []Decision{
			{PoP: "a", Send: ms(0), Recv: ms(10), Allowed: true},
			{PoP: "a", Send: t0.Add(time.Hour + time.Second), Recv: t0.Add(time.Hour + time.Second + time.Millisecond), Allowed: false},
		}, 0, 0, 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			for i := range c.ds {
				c.ds[i].Limit, c.ds[i].Hits = "g", 1
			}
			rows := Ledger(lim, append(c.ds, Decision{Limit: "other", Send: ms(1), Recv: ms(2), Hits: 1, Allowed: true}))
			var over, overBound, under, offered int64
			for _, r := range rows {
				over += r.Over
				overBound += r.OverBound
				under += r.Under
				offered += r.Offered
			}
			if over != c.over || overBound != c.overBound || under != c.under || int64(len(rows)) != c.rows || offered != int64(len(c.ds)) {
				t.Errorf("over %d beyond bound %d under %d in %d rows (offered %d); want %d %d %d in %d rows (offered %d)",
					over, overBound, under, len(rows), offered, c.over, c.overBound, c.under, c.rows, len(c.ds))
			}
		})
	}
	b := lim
	b.Bounded = true
	rows := Ledger(b, []Decision{
		{Limit: "g", PoP: "a", Send: ms(0), Recv: ms(10), Hits: 1, Allowed: true},
		{Limit: "g", PoP: "b", Send: ms(20), Recv: ms(30), Hits: 1, Allowed: true},
	})
	if len(rows) != 1 || rows[0].OverBound != 1 || rows[0].OverPct() != 100 {
		t.Errorf("bounded: %+v; want the second admission beyond the bound (the limit), 100%% of it", rows)
	}
}

// TestLedgerShortAndExcess: a window that admits 98 of a limit of 100 and
// then denies 52 checks has 52 denials under but is only 2 hits short; one
// that admits 294 is 194 in excess.
func TestLedgerShortAndExcess(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).Truncate(time.Hour)
	lim := LedgerLimit{Name: "g", Limit: 100, Window: time.Hour, Bounded: true}
	var ds []Decision
	for i := range 150 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		ds = append(ds, Decision{Limit: "g", PoP: "a", Send: at, Recv: at, Hits: 1, Allowed: i < 98})
	}
	rows := Ledger(lim, ds)
	if len(rows) != 1 || rows[0].Under != 52 || rows[0].Short() != 2 || rows[0].Excess() != 0 {
		t.Errorf("98 admitted then 52 denied: %+v, short %d, excess %d; want 52 under, 2 short, no excess", rows, rows[0].Short(), rows[0].Excess())
	}
	for i := range ds {
		ds[i].Allowed = i < 294
	}
	rows = Ledger(lim, ds)
	if r := (LedgerRow{Of: 100, Offered: 300, Admitted: 294}); r.Excess() != 194 || r.Short() != 0 {
		t.Errorf("294 of 300 admitted: excess %d, short %d; want 194, 0", r.Excess(), r.Short())
	}
	if rows[0].Over != 50 || rows[0].Excess() != 50 {
		t.Errorf("150 admitted one after the other: over %d, excess %d; want 50, 50", rows[0].Over, rows[0].Excess())
	}
}
