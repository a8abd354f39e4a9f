package escrow

// Coming is how many hits of key this replica may admit at now, counting
// the allowance that is about to reach it: its room now, plus what its part
// of the others' gives would add. A caller whose check this replica denied
// may wait for a give when Coming covers the check's hits (and the hits of
// the checks already waiting), and need not wait when it does not.
//
// A give is about to come when, by the demand every replica has published
// (this replica's own requests included, which Decide and Request counted
// when it denied), this replica holds less than its target, and the other
// replicas heard from within the window hold more than their own targets
// plus the band, beyond what they used: what Rebalance makes them give once
// they hear this demand, split in proportion to the deficits of the
// replicas below their targets, of which this replica's is one. The others'
// fractions and counts are this ledger's view (start share plus the gives
// heard to them minus their gives heard; their counts as heard), so the
// figure may be stale by the news in flight: Coming only steers how long a
// caller waits, and no decision depends on it. A key this replica has no
// entry for in the current window has nothing coming.
//
// It changes no state but the scratch slices Rebalance also uses, and costs
// O(N) like a sliding window's Decide.
func (l *Ledger) Coming(now int64, key string, spec Spec) int64 {
	if spec.Validate() != nil {
		return 0
	}
	now = l.clock(now)
	cur := windowStart(now, spec.Window)
	e := l.entries[entryKey{key, cur}]
	if e == nil {
		return 0
	}
	d, x := l.room(e, now)
	f, used := l.held(e), l.ownUsed(e)
	if x == 0 {
		return 0 // the previous window fills this one: no give makes room
	}
	l.targets(now, key, spec, cur) // sets l.demand
	var sum uint64
	for _, dk := range l.demand {
		sum = addSat(sum, dk)
	}
	if sum > 0 && l.demand[l.self] > 0 {
		lim := uint64(spec.Limit)
		var spare, short, mine uint64 // others' excess; every replica's and this one's deficit
		for k := range l.names {
			target := mulDiv(l.scale, l.demand[k], sum)
			fk := f
			if k != l.self {
				if l.alive[k] < now-spec.Window {
					continue // a replica not heard from in a window gives nothing
				}
				fk = l.estimate(e, k, cur)
			}
			if fk < target {
				short = addSat(short, target-fk)
				if k == l.self {
					mine = target - fk
				}
				continue
			}
			if k == l.self || fk <= addSat(target, l.band) {
				continue
			}
			usedK := mulDivCeil(e.count[k], l.scale, lim) // what its count needs of a fixed window, at least
			spare = addSat(spare, subSat(fk, max(target, usedK)))
		}
		if mine > 0 {
			f = addSat(f, mulDiv(spare, mine, short))
		}
	}
	return int64(subSat(mulDiv(min(f, l.scale), x, d), used))
}
