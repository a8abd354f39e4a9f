package lab

import (
	"fmt"
	"io"
	"slices"
	"time"
)

// Decision is one check the lab sent and the answer it read: what the
// ledger grades.
type Decision struct {
	Limit      string    // the ledger's name of the limit (and key) it was checked against
	PoP        string    // the PoP whose server answered (not the server: servers of a PoP share a store)
	Send, Recv time.Time // request written, answer read: the PoP decided in between
	Hits       int64
	Allowed    bool
}

// LedgerLimit is one limit the ledger grades decisions against: Limit hits
// per Window, one key, across every PoP (global).
type LedgerLimit struct {
	Name   string
	Limit  int64
	Window time.Duration
	// Bounded is consistency: bounded, whose stated bound is the limit
	// itself. Otherwise (eventual) the stated bound is the limit plus what
	// the other PoPs admitted within Staleness before a decision: one flush
	// interval plus the news's way between regions, which no PoP can have
	// heard (docs/accuracy-log.md, "the others admit within one network delay").
	Bounded   bool
	Staleness time.Duration
}

// LedgerRow is the ledger of one limit over one fixed window of its unit
// (aligned to the Unix epoch, as the PoPs align them), graded against the
// exact sliding log of every PoP's admissions:
//
//   - Over counts admissions the log was already full for: the hits admitted
//     in the sliding window before it (every one that certainly came
//     before) plus its own exceed the limit;
//   - OverBound counts those of them beyond the stated bound (LedgerLimit);
//   - Under counts denials the log had room for: even counting every
//     admission that may have come before it, its hits fit.
//
// Over and Under count decisions, as the simulator's false allows and
// false denies do; a client denied 50 times while the log held 98 of 100
// is 50 denials under, but only 2 hits short. So the row also says by how
// much the window missed the limit, either way: Excess, the hits it
// admitted past the limit, and Short, those an exact limiter would have
// admitted on top (min(offered, limit) − admitted), as the simulator's
// mean excess per window counts fixed windows.
//
// A real PoP decides at some instant between a request's send and its
// answer, so the order of overlapping decisions is not known: an admission
// is over only if it is over in every order, a denial under only if it is
// under in every order. On decisions with no overlap (Send = Recv) both are
// exactly the simulator's false allows and false denies (simulate.Grade;
// TestLedgerIsTheOracle).
type LedgerRow struct {
	Limit             string
	Of                int64 // the limit
	Start             time.Time
	Offered, Admitted int64
	Over, OverBound   int64
	Under             int64
}

// Excess and Short are the hits the row's window admitted past the limit,
// and short of it.
func (r LedgerRow) Excess() int64 { return max(r.Admitted-r.Of, 0) }
func (r LedgerRow) Short() int64  { return max(min(r.Offered, r.Of)-r.Admitted, 0) }

// OverPct, OverBoundPct and UnderPct are the row's counts in percent of the
// limit.
func (r LedgerRow) OverPct() float64      { return pct(r.Over, r.Of) }
func (r LedgerRow) OverBoundPct() float64 { return pct(r.OverBound, r.Of) }
func (r LedgerRow) UnderPct() float64     { return pct(r.Under, r.Of) }

func pct(n, of int64) float64 {
	if of <= 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// Ledger grades the decisions of limit lim (those of ds with Limit ==
// lim.Name), window by window.
func Ledger(lim LedgerLimit, ds []Decision) []LedgerRow {
	var mine []Decision
	for _, d := range ds {
		if d.Limit == lim.Name {
			mine = append(mine, d)
		}
	}
	slices.SortStableFunc(mine, func(a, b Decision) int { return a.Send.Compare(b.Send) })
	w := lim.Window
	var rows []LedgerRow
	row := func(at time.Time) *LedgerRow {
		start := at.Truncate(w)
		if n := len(rows); n > 0 && rows[n-1].Start.Equal(start) {
			return &rows[n-1]
		}
		rows = append(rows, LedgerRow{Limit: lim.Name, Of: lim.Limit, Start: start})
		return &rows[len(rows)-1]
	}
	// The admissions by send time: every admission a decision's rules can
	// count was sent within reach of it (see near).
	var adm []Decision
	var longest time.Duration
	for _, d := range mine {
		if d.Allowed {
			adm = append(adm, d)
		}
		longest = max(longest, d.Recv.Sub(d.Send))
	}
	reach := max(w, lim.Staleness) + longest
	bySend := func(b Decision, t time.Time) int { return b.Send.Compare(t) }
	// near is the range of adm sent within reach of d.
	near := func(d Decision) (lo, hi int) {
		lo, _ = slices.BinarySearchFunc(adm, d.Send.Add(-reach), bySend)
		hi, _ = slices.BinarySearchFunc(adm, d.Recv.Add(time.Nanosecond), bySend)
		return lo, hi
	}
	k := -1 // d's index in adm, when d is an admission
	for _, d := range mine {
		r := row(d.Send)
		r.Offered += d.Hits
		if !d.Allowed {
			// Every admission that may have been decided before d, within
			// the sliding window ending when d was.
			var before int64
			lo, hi := near(d)
			for _, b := range adm[lo:hi] {
				if b.Send.Before(d.Recv) && b.Recv.After(d.Send.Add(-w)) {
					before += b.Hits
				}
			}
			if before+d.Hits <= lim.Limit {
				r.Under++
			}
			continue
		}
		r.Admitted += d.Hits
		k++
		// Every admission certainly decided before d within the sliding
		// window ending when d was; and, of the others' admissions, those
		// d's PoP cannot have heard of.
		var before, unheard int64
		lo, hi := near(d)
		for j, b := range adm[lo:hi] {
			if lo+j == k {
				continue
			}
			if b.Recv.Before(d.Send) && b.Send.After(d.Recv.Add(-w)) {
				before += b.Hits
			}
			if b.PoP != d.PoP && !b.Recv.Before(d.Send.Add(-lim.Staleness)) && !b.Send.After(d.Recv) {
				unheard += b.Hits
			}
		}
		if before+d.Hits > lim.Limit {
			r.Over++
			bound := lim.Limit
			if !lim.Bounded {
				bound += unheard
			}
			if before+d.Hits > bound {
				r.OverBound++
			}
		}
	}
	return rows
}

// writeLedger writes rows as a table: one line per (limit, window).
func writeLedger(w io.Writer, rows []LedgerRow) {
	fmt.Fprintf(w, "%-12s %-17s %7s %8s %8s %8s %6s %7s %8s %6s\n", "limit", "window", "offered", "admitted",
		"excess%", "short%", "over", "beyond", "under", "under%")
	for _, r := range rows {
		fmt.Fprintf(w, "%-12s %-17s %7d %8d %8.1f %8.1f %6d %7d %8d %6.1f\n", r.Limit, r.Start.UTC().Format("2006-01-02T15:04"),
			r.Offered, r.Admitted, pct(r.Excess(), r.Of), pct(r.Short(), r.Of), r.Over, r.OverBound, r.Under, r.UnderPct())
	}
	fmt.Fprintln(w, "(excess%, short%: hits admitted past the limit and short of it, % of the limit; over, beyond: admissions the exact")
	fmt.Fprintln(w, " sliding log was full for, and of them past the stated bound; under: denials it had room for, and % of the limit)")
}
