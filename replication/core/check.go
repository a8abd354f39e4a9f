package core

import (
	"fmt"
	"slices"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
)

// Bounds says what an honest replica can have sent: the receiver's defence
// in depth behind the NATS subject permissions (a stolen credential, a
// misconfigured server, a leaf link from a compromised site). The PoP
// implements it from its rules (pop.ReplicaBounds); nil checks neither
// counts nor bits' ends. Implementations are safe for concurrent use and
// cheap: the core calls them once per received slot and bit.
type Bounds interface {
	// MaxCount returns the highest count an honest replica can report for
	// key in one window. 0 means no replica ever replicates key.
	MaxCount(key string) uint64
	// MaxBit returns how long after the receiver's now an honest mitigation
	// bit on key can still hold.
	MaxBit(key string) time.Duration
}

// CountFloor is a Bounds that knows a count no key's MaxCount is below
// (except keys no PoP replicates, whose counts count for nothing): the core
// then calls MaxCount only for counts above the floor. Looking up a key's
// bound costs more than the rest of receiving its slot, and most counts are
// far under their limit.
type CountFloor interface {
	CountFloor() uint64
}

// Reject says why the core refused a received message, or part of one. Every
// reject is counted in Ready.Rejected and described in Ready.RejectedWhy.
type Reject uint8

const (
	// RejectReplica: the sender is not a PoP of the topology in the region it
	// names (a replica outside the topology, or one naming another region,
	// such as a beacon "from" a region that is cut off). The whole message is
	// dropped.
	RejectReplica Reject = iota
	// RejectSender: a slot's replica or a bit's origin is not the PoP that
	// sent it; a PoP only ever publishes its own. The slot or bit is dropped.
	RejectSender
	// RejectCount: a count above Bounds.MaxCount, which no replica could
	// have admitted. It is applied as the bound (see clampCount).
	RejectCount
	// RejectBitEnd: a bit ending later than Bounds.MaxBit from now. It is
	// applied ending then.
	RejectBitEnd

	// NumRejects is the number of reasons, for arrays indexed by Reject.
	NumRejects = iota
)

// String returns the reason's metric label.
func (r Reject) String() string {
	switch r {
	case RejectReplica:
		return "unknown_replica"
	case RejectSender:
		return "sender_mismatch"
	case RejectCount:
		return "count_bound"
	case RejectBitEnd:
		return "bit_end"
	}
	return fmt.Sprintf("Reject(%d)", int(r))
}

// reject counts one reject of why and keeps what for the driver's log.
func (c *Core) reject(why Reject, m *Message, format string, args ...any) {
	c.rd.Rejected[why]++
	if c.rd.RejectedWhy[why] == "" { // one example per Ready is enough for a log line
		c.rd.RejectedWhy[why] = fmt.Sprintf("%s from %s/%s: ", m.Kind, m.Region, m.POP) + fmt.Sprintf(format, args...)
	}
}

// member says whether m's sender is a PoP of the topology in the region it
// names. Without a topology every sender is.
func (c *Core) member(m *Message) bool {
	return len(c.cfg.Topology.Regions) == 0 || c.cfg.Topology.Member(m.Region, m.POP)
}

// checkSlots returns m's slots that its sender could have sent: its own
// replica's, each count at most Bounds.MaxCount. It copies m.Slots before
// it changes anything, since a driver may hand the same message to several
// cores (the simulator does).
//
// Why a count above the bound is clamped, not dropped. A replica admits a
// hit only while its estimate plus the hits fits the limit, and its own count
// of the window is part of that estimate, so its count never exceeds the
// highest limit it applied to the key during the window. The bound
// (pop.ReplicaBounds) is a multiple of the receiver's limit to leave room for
// a limit lowered mid-window or raised on the sender first during a rollout.
// Clamped at the bound, a count is still at or over the receiver's limit, so
// the receiver denies the key exactly as the true count would make it do;
// dropped, an honest count over the bound would make the receiver forget the
// replica's hits and admit more. Either way a forged 2^40 can no longer
// deny a key for longer than an honest PoP at the limit could.
func (c *Core) checkSlots(m *Message) []crdt.Slot {
	out, copied, n := m.Slots, false, 0
	var floor uint64
	if f, ok := c.cfg.Bounds.(CountFloor); ok {
		floor = f.CountFloor()
	}
	for _, s := range m.Slots {
		keep, changed := true, false
		switch {
		case s.Replica != m.POP:
			c.reject(RejectSender, m, "slot of replica %q", s.Replica)
			keep = false
		case c.cfg.Bounds != nil && s.Count > floor:
			if bound := c.cfg.Bounds.MaxCount(s.Key); s.Count > bound {
				c.reject(RejectCount, m, "count %d of key %q above the bound %d", s.Count, s.Key, bound)
				s.Count, changed, keep = bound, true, bound > 0
			}
		}
		if (!keep || changed) && !copied {
			out, copied = slices.Clone(m.Slots), true
		}
		if keep {
			out[n] = s
			n++
		}
	}
	return out[:n]
}

// checkBits returns m's bits that its sender could have issued, and their
// issue times when m has them: its own bits, each ending at most
// Bounds.MaxBit after now (clamped, as counts are: an honest bit never ends
// later, and a clamped one still denies the key meanwhile).
func (c *Core) checkBits(now int64, m *Message) ([]crdt.Bit, []int64) {
	bits, issued, copied, n := m.Bits, m.Issued, false, 0
	for i, b := range m.Bits {
		keep, changed := true, false
		switch {
		case b.Origin != m.POP:
			c.reject(RejectSender, m, "bit of origin %q", b.Origin)
			keep = false
		case c.cfg.Bounds != nil:
			if most := int64(c.cfg.Bounds.MaxBit(b.Key)); b.Until-now > most {
				c.reject(RejectBitEnd, m, "bit on key %q ends in %v, more than %v", b.Key, time.Duration(b.Until-now), time.Duration(most))
				b.Until, changed = now+most, true
			}
		}
		if (!keep || changed) && !copied {
			bits, issued, copied = slices.Clone(m.Bits), slices.Clone(m.Issued), true
		}
		if keep {
			bits[n] = b
			if i < len(issued) {
				issued[n] = issued[i]
			}
			n++
		}
	}
	return bits[:n], issued[:min(n, len(issued))]
}

// CheckOwn returns the slots of m, a delta batch under this PoP's own name
// read back from the stream (the driver restores its own counts from it),
// that this PoP could have sent: its own replica's, each count at most
// Bounds.MaxCount, as Step checks another PoP's. A message under this PoP's
// name need not be its own: a stream transform, a misconfigured server or a
// stolen credential can put anything there, and a count restored as own is
// published again as this PoP's. Rejects are counted in the next Ready.
func (c *Core) CheckOwn(m Message) []crdt.Slot {
	if m.POP != c.cfg.POP || m.Kind != Delta {
		return nil
	}
	return c.checkSlots(&m)
}
