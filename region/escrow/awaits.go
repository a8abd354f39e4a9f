package escrow

// Awaits reports whether a check of hits on key at now that this replica
// cannot admit may be admitted by waiting a little: either there is room for
// hits already (news arrived since the check), or another replica is about
// to give this replica allowance of the current window.
//
// A give is about to come when, by the demand every replica has published
// (this replica's own requests included, which Decide and Request counted
// when it denied), this replica holds less than its target, and the other
// replicas heard from within the window hold, beyond their own targets plus
// the band and beyond what they used, enough that this replica's part of it
// — Rebalance splits a give in proportion to the deficits — is worth the
// hits: what Rebalance makes them give once they hear this demand. Dust
// (less than the hits, such as the fractions of a hit each replica's
// rounding leaves unused) is not worth waiting for. The estimate of the other
// replica's fraction is this ledger's (start share plus the gives heard to it
// minus its gives heard), so it may be stale by the news in flight; Awaits
// only steers how long a caller waits, and no decision depends on it. A key
// this replica has no entry for in the current window awaits nothing.
//
// It changes no state but the scratch slices Rebalance also uses, and costs
// O(N) like a sliding window's Decide.
func (l *Ledger) Awaits(now int64, key string, spec Spec, hits int64) bool {
	if hits <= 0 || spec.Validate() != nil || uint64(hits) > uint64(spec.Limit) {
		return false
	}
	now = l.clock(now)
	cur := windowStart(now, spec.Window)
	e := l.entries[entryKey{key, cur}]
	if e == nil {
		return false
	}
	d, x := l.room(e, now)
	if f := l.held(e); mulDiv(f, x, d) >= addSat(l.ownUsed(e), uint64(hits)) {
		return true // room already: retry now
	}
	if x == 0 {
		return false // the previous window fills this one: no give makes room
	}
	l.targets(now, key, spec, cur) // sets l.demand
	var sum uint64
	for _, dk := range l.demand {
		sum = addSat(sum, dk)
	}
	if sum == 0 || l.demand[l.self] == 0 {
		return false
	}
	lim := uint64(spec.Limit)
	var spare, short, mine uint64 // others' unused excess; every replica's and this one's deficit
	for k := range l.names {
		target := mulDiv(l.scale, l.demand[k], sum)
		f := l.held(e)
		if k != l.self {
			if l.alive[k] < now-spec.Window {
				continue // a replica not heard from in a window gives nothing
			}
			f = l.estimate(e, k, cur)
		}
		if f < target {
			short = addSat(short, target-f)
			if k == l.self {
				mine = target - f
			}
			continue
		}
		if k == l.self || f <= addSat(target, l.band) {
			continue
		}
		used := mulDivCeil(e.count[k], l.scale, lim) // what its count needs of a fixed window, at least
		spare = addSat(spare, subSat(f, max(target, used)))
	}
	if mine == 0 {
		return false // this replica holds its share of the demand already
	}
	// Givers split what they give in proportion to the deficits; this
	// replica's part must make room for the hits.
	return mulDiv(spare, mine, short) >= mulDivCeil(uint64(hits), l.scale, lim)
}
