package soak

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab"
)

// Class is one limit of the soak's rule file: a descriptor key with one
// rate_limit of a scope and an algorithm.
type Class struct {
	Name      string // the descriptor key, e.g. "pop_sw"
	Scope     string // pop | region | global
	Algorithm string // sliding_window | fixed_window
	Limit     int    // admissions per Window
}

// Decision is one answered check, as the client saw it.
type Decision struct {
	Send, Recv int64 // unix nanoseconds: request written, answer read
	PoP        int   // index into Topology.PoPs
	Class      int   // index into the classes
	Key        int   // the key's number within its class
	Allowed    bool
}

// Fault is one fault the soak made. Down is when it began (the kill, the
// shutdown), Up when the process answered again.
type Fault struct {
	Kind   string // pop-kill9 | redis-shutdown-nosave | redis-kill9 | nats-restart
	Target string // the PoP, "redis", or the NATS server's region
	Down   int64
	Up     int64
}

// PoPInfo names a PoP, its region and whether its store is Redis.
type PoPInfo struct {
	Name, Region string
	Redis        bool
}

// Bounds are the parameters the docs' bounds are stated in.
type Bounds struct {
	Window        time.Duration // every class's window
	FlushInterval time.Duration // --flush-interval: what a kill -9 may lose
	// Staleness is how old, at most, what a PoP has heard of another PoP's
	// admissions is outside faults: one --flush-interval plus propagation
	// (loopback, but a loaded machine).
	Staleness time.Duration
	// NATSRecovery is how long after a NATS server is back its PoPs may
	// still decide on stale counts: the client's reconnect wait plus one
	// --snapshot-interval ("snapshots repair anything a lost message left
	// behind").
	NATSRecovery time.Duration
}

// WindowResult is the ledger of one (key, limit, scope entity, window).
type WindowResult struct {
	Class, Key, Entity string
	Start              time.Time
	Admitted           int // decisions sent and answered inside the window
	Straddling         int // admitted, sent in one window and answered in the next
	Limit, Bound       int
	// Strict is the bound without what NATS outages add: the limit, the
	// hits kill -9s lost and the unheard admissions.
	Strict int
	Why    []string // what the bound adds to the limit
	Faults []string // faults in the window or the one before
	Kinds  []string // their kinds
}

// ClassSummary aggregates one class.
type ClassSummary struct {
	Class           Class
	Keys, Windows   int
	Admitted        int
	MaxRatio        float64 // max admitted/limit over its windows
	OverLimit       int     // windows admitting more than the limit
	OverBound       int     // windows admitting more than the bound: violations
	OverStrict      int     // windows admitting more than the strict bound (see WindowResult.Strict)
	MaxOverBoundPct float64
	// Under counts denials while the exact sliding log of the scope
	// entity's admissions had room for them, in every order overlapping
	// decisions may have been made in (lab.Ledger's rule), over the checked
	// windows; MaxUnderPct is the most in one window, in % of the limit.
	// MaxShortPct is the most a window admitted short of what an exact
	// limiter admits (min(offered, limit) − admitted), in % of the limit:
	// a client denied 40 times while the log held 48 of 50 is 40 denials
	// under but 2 hits short.
	Under                    int
	MaxUnderPct, MaxShortPct float64
}

// Ledger is the soak's verdict.
type Ledger struct {
	Decisions, Allowed, Errors int
	Keys, Windows              int
	WarmUp                     int     // windows of the load's first, partial window: not checked
	WarmUpMaxRatio             float64 // their max admitted/limit
	Classes                    []ClassSummary
	Violations                 []WindowResult
	OverLimit                  []WindowResult // every window over its limit, violation or not
	Faults                     []Fault
}

func entityOf(scope string, p PoPInfo) string {
	switch scope {
	case "pop":
		return p.Name
	case "region":
		return p.Region
	}
	return "*"
}

func inScope(scope, entity string, p PoPInfo) bool { return entityOf(scope, p) == entity }

// Check computes the ledger: for every (class, key, scope entity, window)
// the admissions counted, checked against the bound the docs state for
// the faults that touched that window (see deploy/soak/README.md).
func Check(classes []Class, pops []PoPInfo, decisions []Decision, faults []Fault, b Bounds, errors int) *Ledger {
	w := b.Window.Nanoseconds()
	type gkey struct {
		class, key int
		entity     string
	}
	type wkey struct {
		g   gkey
		win int64
	}
	groups := map[gkey][]int{} // indexes of admitted decisions
	led := &Ledger{Decisions: len(decisions), Errors: errors, Faults: faults}
	// The load's first, partial window is its keys' cold start, which the
	// docs/accuracy-log.md leaves out of its bound ("plus a key's very first messages,
	// before any rate can be measured"): it is reported apart, not checked.
	start := int64(math.MaxInt64)
	for _, d := range decisions {
		start = min(start, d.Send)
	}
	for i, d := range decisions {
		if !d.Allowed {
			continue
		}
		led.Allowed++
		g := gkey{d.Class, d.Key, entityOf(classes[d.Class].Scope, pops[d.PoP])}
		groups[g] = append(groups[g], i)
	}
	sums := make([]ClassSummary, len(classes))
	keys := make([]map[string]bool, len(classes))
	for i, c := range classes {
		sums[i].Class = c
		keys[i] = map[string]bool{}
	}
	gks := make([]gkey, 0, len(groups))
	for g := range groups {
		gks = append(gks, g)
	}
	sort.Slice(gks, func(i, j int) bool {
		a, c := gks[i], gks[j]
		if a.class != c.class {
			return a.class < c.class
		}
		if a.key != c.key {
			return a.key < c.key
		}
		return a.entity < c.entity
	})
	for _, g := range gks {
		idx := groups[g]
		c := classes[g.class]
		keys[g.class][fmt.Sprint(g.key, "/", g.entity)] = true
		wins := map[int64][]int{} // window → admissions answered in it or sent in it
		definite := map[int64]int{}
		straddle := map[int64]int{}
		for _, i := range idx {
			d := decisions[i]
			ws, wr := d.Send/w, d.Recv/w
			if ws == wr {
				definite[ws]++
			} else {
				straddle[ws]++
				wins[wr] = append(wins[wr], i)
			}
			wins[ws] = append(wins[ws], i)
		}
		order := make([]int64, 0, len(wins))
		for win := range wins {
			order = append(order, win)
		}
		slices.Sort(order)
		for _, win := range order {
			a, e := win*w, (win+1)*w
			r := WindowResult{Class: c.Name, Key: fmt.Sprintf("k%d", g.key), Entity: g.entity,
				Start: time.Unix(0, a).UTC(), Admitted: definite[win], Straddling: straddle[win], Limit: c.Limit}
			bound := c.Limit
			inWin := wins[win]
			// A kill -9 loses what the PoP admitted in its last flush interval
			// (docs/durability.md): the restarted PoP may admit that again.
			for _, f := range faults {
				if f.Kind != "pop-kill9" || f.Down-b.FlushInterval.Nanoseconds() >= e || f.Up < a {
					continue
				}
				lost := 0
				for _, i := range inWin {
					d := decisions[i]
					if pops[d.PoP].Name == f.Target && d.Recv >= f.Down-b.FlushInterval.Nanoseconds() && d.Send <= f.Down {
						lost++
					}
				}
				if lost > 0 {
					bound += lost
					r.Why = append(r.Why, fmt.Sprintf("+%d lost by kill -9 of %s", lost, f.Target))
				}
			}
			if c.Scope != "pop" {
				// Outside faults: limit + what the other PoPs of the scope
				// admitted within one staleness before the window's last
				// admission (docs/replication.md, "Partitions": "what each side admits
				// within one flush interval plus propagation").
				last := -1
				for _, i := range inWin {
					d := decisions[i]
					if d.Send/w == win && d.Recv/w == win && (last < 0 || d.Recv > decisions[last].Recv) {
						last = i
					}
				}
				if last >= 0 {
					l := decisions[last]
					unheard := 0
					for _, i := range inWin {
						d := decisions[i]
						if d.PoP != l.PoP && d.Recv >= l.Send-b.Staleness.Nanoseconds() && d.Send <= l.Recv {
							unheard++
						}
					}
					if unheard > 0 {
						bound += unheard
						r.Why = append(r.Why, fmt.Sprintf("+%d unheard (others' admissions within %v)", unheard, b.Staleness))
					}
				}
				r.Strict = bound
				// A NATS server down cuts its region's PoPs from each other and
				// from the other regions: until that is noticed "k sides admit
				// up to k limits per window" (docs/replication.md, Partitions).
				for _, f := range faults {
					if f.Kind != "nats-restart" || f.Down >= e || f.Up+b.NATSRecovery.Nanoseconds() < a {
						continue
					}
					sides := 0
					other := false
					for _, p := range pops {
						if !inScope(c.Scope, g.entity, p) {
							continue
						}
						if p.Region == f.Target {
							sides++
						} else {
							other = true
						}
					}
					if other && sides > 0 {
						sides++
					}
					if sides > 1 {
						bound += (sides - 1) * c.Limit
						r.Why = append(r.Why, fmt.Sprintf("+%d×limit: NATS %s down, %d sides", sides-1, f.Target, sides))
					}
				}
				// Redis restarts, empty or from an old snapshot, add nothing:
				// "the embedded store goes on from Redis' last word, not from
				// zero; when Redis comes back — or comes back empty — [...] the
				// PoP decides on its own knowledge and gives Redis the missing
				// hits" (docs/durability.md, Redis); and while it is away, region
				// and global limits are decided on the Redis store's own counts
				// of every PoP, which it publishes and puts back (docs/durability.md,
				// "Region and global keys on Redis"). Each Redis here serves one
				// server, so "hits other servers admitted on their own while
				// Redis was away" are none.
			}
			// Faults listed with a window: those in it or in the window
			// before (a sliding window's estimate reads the previous one).
			for _, f := range faults {
				if f.Down < e && f.Up >= a-w {
					r.Faults = append(r.Faults, fmt.Sprintf("%s %s at %s", f.Kind, f.Target, time.Unix(0, f.Down).UTC().Format("15:04:05.000")))
					if !slices.Contains(r.Kinds, f.Kind) {
						r.Kinds = append(r.Kinds, f.Kind)
					}
				}
			}
			slices.Sort(r.Kinds)
			r.Bound = bound
			if c.Scope == "pop" {
				r.Strict = bound
			}
			s := &sums[g.class]
			if r.Admitted == 0 && r.Straddling == 0 {
				continue
			}
			if a < start {
				led.WarmUp++
				led.WarmUpMaxRatio = max(led.WarmUpMaxRatio, float64(r.Admitted)/float64(c.Limit))
				continue
			}
			s.Windows++
			s.Admitted += r.Admitted
			ratio := float64(r.Admitted) / float64(c.Limit)
			s.MaxRatio = max(s.MaxRatio, ratio)
			if r.Admitted > c.Limit {
				s.OverLimit++
				led.OverLimit = append(led.OverLimit, r)
			}
			if r.Admitted > r.Strict {
				s.OverStrict++
			}
			if r.Admitted > r.Bound {
				s.OverBound++
				s.MaxOverBoundPct = max(s.MaxOverBoundPct, 100*float64(r.Admitted-r.Bound)/float64(r.Bound))
				led.Violations = append(led.Violations, r)
			}
		}
	}
	underAdmission(classes, pops, decisions, b.Window, start, sums)
	for i := range sums {
		sums[i].Keys = len(keys[i])
		led.Keys += sums[i].Keys
		led.Windows += sums[i].Windows
	}
	led.Classes = sums
	return led
}

// underAdmission adds to sums the denials every (class, key, scope entity)
// had room for in the exact sliding log of its admissions (lab.Ledger), in
// the windows that begin at or after start.
func underAdmission(classes []Class, pops []PoPInfo, decisions []Decision, window time.Duration, start int64, sums []ClassSummary) {
	type gkey struct {
		class, key int
		entity     string
	}
	groups := map[gkey][]lab.Decision{}
	for _, d := range decisions {
		g := gkey{d.Class, d.Key, entityOf(classes[d.Class].Scope, pops[d.PoP])}
		groups[g] = append(groups[g], lab.Decision{PoP: pops[d.PoP].Name, Send: time.Unix(0, d.Send), Recv: time.Unix(0, d.Recv), Hits: 1, Allowed: d.Allowed})
	}
	for g, ds := range groups {
		c := classes[g.class]
		for _, r := range lab.Ledger(lab.LedgerLimit{Limit: int64(c.Limit), Window: window, Bounded: true}, ds) {
			if r.Start.UnixNano() < start {
				continue
			}
			sums[g.class].Under += int(r.Under)
			sums[g.class].MaxUnderPct = max(sums[g.class].MaxUnderPct, r.UnderPct())
			sums[g.class].MaxShortPct = max(sums[g.class].MaxShortPct, 100*float64(r.Short())/float64(c.Limit))
		}
	}
}

// Print writes the ledger summary.
func (l *Ledger) Print(out io.Writer) {
	fmt.Fprintf(out, "soak ledger: %d decisions (%d admitted, %d transport errors), %d keys, %d windows checked\n",
		l.Decisions, l.Allowed, l.Errors, l.Keys, l.Windows)
	kinds := map[string]int{}
	for _, f := range l.Faults {
		kinds[f.Kind]++
	}
	var ks []string
	for k, n := range kinds {
		ks = append(ks, fmt.Sprintf("%s ×%d", k, n))
	}
	slices.Sort(ks)
	fmt.Fprintf(out, "faults: %s\n", strings.Join(ks, ", "))
	fmt.Fprintf(out, "cold start: %d windows of the load's first, partial window not checked (max admitted/limit %.3f)\n", l.WarmUp, l.WarmUpMaxRatio)
	fmt.Fprintf(out, "%-10s %-7s %-15s %5s %5s %7s %9s %13s %10s %11s %10s %6s %10s %10s\n",
		"class", "scope", "algorithm", "limit", "keys", "windows", "admitted", "max adm/limit", "over limit", "over strict", "over bound", "under", "max under%", "max short%")
	for _, s := range l.Classes {
		fmt.Fprintf(out, "%-10s %-7s %-15s %5d %5d %7d %9d %13.3f %10d %11d %10d %6d %10.1f %10.1f\n",
			s.Class.Name, s.Class.Scope, s.Class.Algorithm, s.Class.Limit, s.Keys, s.Windows, s.Admitted, s.MaxRatio, s.OverLimit, s.OverStrict, s.OverBound, s.Under, s.MaxUnderPct, s.MaxShortPct)
	}
	fmt.Fprintln(out, "(under: denials while the exact sliding log of the scope's admissions had room, in every order overlapping decisions may have come in;")
	fmt.Fprintln(out, " short: what a window admitted short of min(offered, limit), % of the limit)")
	fmt.Fprintln(out, "(over strict: over limit + hits lost to kill -9 + others' admissions unheard within the staleness, before the NATS outage allowance)")
	if len(l.Violations) == 0 {
		fmt.Fprintln(out, "violations: none")
		return
	}
	fmt.Fprintf(out, "violations: %d\n", len(l.Violations))
	byKinds := map[string]int{}
	for _, v := range l.Violations {
		k := strings.Join(v.Kinds, "+")
		if k == "" {
			k = "no fault"
		}
		byKinds[k]++
	}
	var kk []string
	for k, n := range byKinds {
		kk = append(kk, fmt.Sprintf("%s: %d", k, n))
	}
	slices.Sort(kk)
	fmt.Fprintf(out, "violations by the faults in their window or the one before: %s\n", strings.Join(kk, ", "))
	for _, v := range l.Violations {
		v.print(out)
	}
}

// PrintOverLimit lists every window that admitted more than its limit,
// with what its bound allowed and why.
func (l *Ledger) PrintOverLimit(out io.Writer) {
	fmt.Fprintf(out, "windows over their limit: %d\n", len(l.OverLimit))
	for _, v := range l.OverLimit {
		v.print(out)
	}
}

func (v WindowResult) print(out io.Writer) {
	fmt.Fprintf(out, "  %s key=%s entity=%s window=%s admitted=%d (+%d straddling) limit=%d strict=%d bound=%d [%s] faults in this or the previous window: [%s]\n",
		v.Class, v.Key, v.Entity, v.Start.Format("15:04:05"), v.Admitted, v.Straddling, v.Limit, v.Strict, v.Bound,
		strings.Join(v.Why, "; "), strings.Join(v.Faults, "; "))
}
