package replication

// restoreOwn raises this PoP's own counts to those one of its own delta
// batches carried, read back from its region's stream. A PoP's own counts
// only grow, so in steady state this changes nothing (crdt.Local.Restore
// raises no count, and marks nothing for the next flush). It matters after
// the PoP lost its durable state — a damaged data directory moved aside, as
// README "Durability" says: the PoP then consumes the stream from its start
// and, within the stream's retention (which keeps every window still
// counting), gets back what it published before, so it never publishes lower
// counts than before under its name, and its new hits count on top of the
// old ones everywhere. Batches that do not decode are ignored here (the
// other PoPs drop and count them).
func (r *Replicator) restoreOwn(kind, region, pop string, data []byte) {
	if kind != kindDelta {
		return
	}
	slots, _, err := decodeDelta(data, region, pop)
	if err != nil || len(slots) == 0 {
		return
	}
	r.cfg.Counts.Restore(slots)
}
