package core

import (
	"github.com/edgelimit/edgelimit/crdt"
	"slices"

	"github.com/edgelimit/edgelimit/region"
)

// Step hands the core a message another PoP sent, received at now (unix
// ns), decoded and checked by the driver. Messages of this PoP are ignored.
// Deltas and snapshots come back as Ready.Apply; bits too, once filtered
// (region.AcceptBit); a beacon updates reachability, and when its sender is
// new or one of its beacons went missing (a link dropped, the sender
// restarted) the next flush also publishes a snapshot.
//
// Step checks what it is given (check.go): a message from a replica outside
// the topology, or naming another region than its own, is dropped; slots and
// bits that are not the sender's own are dropped; counts and bits' ends past
// Config.Bounds are clamped. Each is counted in Ready.Rejected.
func (c *Core) Step(now int64, m Message) {
	if m.POP == c.cfg.POP {
		return
	}
	if !c.member(&m) {
		c.reject(RejectReplica, &m, "not a PoP of region %q in the topology", m.Region)
		return
	}
	switch m.Kind {
	case Hello:
		last, known := c.heard[m.POP]
		c.heard[m.POP] = m.Seq
		if !known || m.Seq != last+1 {
			c.missed(now, m.POP, known)
		}
		c.reach.Heard(m.Region, now)
		c.hearClock(now, m)
		c.review(now)
		// The counts hear of it too: a beacon says the sender's link was
		// carrying news when it left (BeaconCounts).
		c.rd.Apply = append(c.rd.Apply, Apply{Kind: Hello, Region: m.Region, POP: m.POP, Sent: m.Sent})
	case Delta:
		if slots := c.checkSlots(&m); len(slots) > 0 {
			c.rd.Apply = append(c.rd.Apply, Apply{Kind: Delta, Region: m.Region, POP: m.POP, Sent: m.Sent, Slots: slots})
		}
	case Snapshot, BitsBatch:
		a := Apply{Kind: m.Kind, Region: m.Region, POP: m.POP, Sent: m.Sent}
		if m.Kind == Snapshot {
			a.Slots = c.checkSlots(&m)
		}
		m.Bits, m.Issued = c.checkBits(now, &m)
		a.Bits, a.Issued = c.filterBits(now, m)
		if len(a.Slots) > 0 || len(a.Bits) > 0 {
			c.rd.Apply = append(c.rd.Apply, a)
		}
	}
}

// filterBits returns the bits of m this PoP takes, and for a bits batch
// their issue times; it counts the others in Ready.DroppedBits. Without Bits
// it takes none and counts none.
func (c *Core) filterBits(now int64, m Message) ([]crdt.Bit, []int64) {
	if c.cfg.Bits == nil || len(m.Bits) == 0 {
		return nil, nil
	}
	keep := make([]crdt.Bit, 0, len(m.Bits))
	var issued []int64
	for i, b := range m.Bits {
		if why, ok := region.AcceptBit(c.cfg.Region, c.cfg.POP, m.Region, b, now); !ok {
			c.rd.DroppedBits[why]++
			continue
		}
		keep = append(keep, b)
		if m.Kind == BitsBatch {
			at := m.Sent
			if i < len(m.Issued) {
				at = m.Issued[i]
			}
			issued = append(issued, at)
		}
	}
	return keep, issued
}

// review works out, at now, which regions are cut off and the share of
// global limits that follows, and reports changes in the Ready.
func (c *Core) review(now int64) {
	c.reviewed = now
	if !c.multiRegion() {
		return
	}
	cut := c.reach.Unreachable(now, int64(c.cfg.UnreachableAfter))
	if slices.Equal(cut, c.unreachable) {
		return
	}
	c.unreachable = cut
	c.rd.Unreachable, c.rd.UnreachableChanged = cut, true
	if share := c.reach.ShareOf(cut, c.cfg.PartitionShare); share != c.share {
		c.share = share
		c.rd.Share = share
	}
}

// missed notes at now that pop is new or a beacon of it went missing: the
// next flush publishes a snapshot. A new PoP always gets one; gaps of one PoP
// get at most two at once and then one per SnapshotInterval (a GCRA, as
// pop/limit's, on gapAt: the time the PoP's gap budget is spent until). So a
// heal, or two, is repaired within a beacon interval, while a PoP whose
// beacons keep skipping numbers (a flapping link, or a PoP forging them)
// costs at most one extra snapshot per SnapshotInterval, not one per
// HelloInterval; the periodic snapshot repairs what a skipped one would have.
func (c *Core) missed(now int64, pop string, known bool) {
	if known {
		iv := int64(c.cfg.SnapshotInterval)
		tat := max(c.gapAt[pop], now)
		if tat-now > iv {
			return
		}
		c.gapAt[pop] = tat + iv
	}
	c.snapshotWanted = true
}

// hearClock takes a beacon's timestamps (clock.go) and, when the estimate
// moved, the new correction into the Ready. The core's own deadlines move
// with the clock, so that they stay at the same raw instant.
func (c *Core) hearClock(now int64, m Message) {
	raw := now - c.clk.offset
	var mine *Echo
	for i := range m.Echo {
		if m.Echo[i].POP == c.cfg.POP {
			mine = &m.Echo[i]
			break
		}
	}
	if p := c.clk.peers[m.POP]; !c.clk.off && m.Sent != 0 && (p == nil || p.lastRecv == 0) {
		// A PoP not heard before (new, or this one just started) gets a
		// beacon back at once, with its echo: both then hold a sample one
		// round trip after they meet, not a beacon interval later.
		c.nextHello = min(c.nextHello, now)
	}
	if !c.clk.heard(m.POP, m.Sent, raw, mine) {
		return
	}
	old := c.clk.offset
	if !c.clk.review(raw) {
		return
	}
	d := c.clk.offset - old
	c.nextFlush += d
	c.nextSnap += d
	c.nextHello += d
	c.reach.Shift(d)
	c.reviewed += d
	for _, due := range []*int64{&c.bitsDue, &c.urgentDue} {
		if *due != never {
			*due += d
		}
	}
	c.rd.ClockOffset, c.rd.ClockChanged = c.clk.offset, true
}

// ClockOffset returns the correction in use: the PoP's clock is its raw
// clock plus this (clock.go).
func (c *Core) ClockOffset() int64 { return c.clk.offset }
