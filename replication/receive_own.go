package replication

import "github.com/edgelimit/edgelimit/replication/core"

// restoreOwn raises this PoP's own counts to those one of its own delta
// batches carried, read back from its region's stream. A PoP's own counts
// only grow, so in steady state this changes nothing (crdt.Local.Restore
// raises no count, and marks nothing for the next flush). It matters after
// the PoP lost its durable state — a damaged data directory moved aside, as
// docs/durability.md says: the PoP then consumes the stream from its start
// and, within the stream's retention (which keeps every window still
// counting), gets back what it published before, so it never publishes lower
// counts than before under its name, and its new hits count on top of the
// old ones everywhere. Batches that do not decode are ignored here (the
// other PoPs drop and count them). What a batch under this PoP's name
// carries is checked as another PoP's would be (core.CheckOwn): a slot of
// another replica is dropped and a count past Config.Bounds clamped, counted
// in Stats.Rejected.
func (r *Replicator) restoreOwn(kind, region, pop string, data []byte) {
	if kind != kindDelta {
		return
	}
	slots, _, err := decodeDelta(data, region, pop)
	if err != nil || len(slots) == 0 {
		return
	}
	r.with(func(c *core.Core) {
		slots = c.CheckOwn(core.Message{Kind: core.Delta, Region: region, POP: pop, Slots: slots})
	})
	if len(slots) > 0 {
		r.cfg.Counts.Restore(slots)
	}
}
