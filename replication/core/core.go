package core

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/region"
)

// Defaults of Config's zero durations.
const (
	DefaultFlushInterval    = 100 * time.Millisecond
	DefaultSnapshotInterval = 5 * time.Second
	DefaultHelloInterval    = 500 * time.Millisecond
	DefaultBitsInterval     = 10 * time.Millisecond
	DefaultUnreachableAfter = 3 * time.Second
	DefaultMaxClockStep     = 2 * time.Second
)

// maxRetrySlots caps the retry set; past it a snapshot replaces it.
const maxRetrySlots = 1 << 20

// Counts is the PoP's counter store as the core reads it. The driver applies
// remote slots itself (Ready.Apply).
type Counts interface {
	// Delta returns this PoP's own slots that changed since the last call,
	// with their absolute counts (crdt.Local.Delta). It must not persist
	// anything: the core hands what to save to the driver (Ready.Save).
	Delta() []crdt.Slot
	// Own returns every own slot, for snapshots.
	Own() []crdt.Slot
}

// CountsAt is a Counts whose delta and snapshot depend on the instant they
// are taken: the bounded limits' allowances move toward demand at each flush
// (region/escrow). The core then calls DeltaAt and OwnAt with its now instead
// of Delta and Own, so that a driver with its own clock (the simulator) runs
// the same code as a PoP.
type CountsAt interface {
	DeltaAt(now int64) []crdt.Slot
	OwnAt(now int64) []crdt.Slot
}

// Bits is the PoP's mitigation bit table as the core reads it.
type Bits interface {
	// BitsDelta returns the bits this PoP issued or extended since the last
	// call (crdt.Bit.Origin is this PoP).
	BitsDelta() []crdt.Bit
}

// UrgentNotifier is a Counts that says when a key nears its limit; the
// driver then calls Core.Urgent, which publishes the delta at once (at most
// once per BitsInterval) instead of with the next flush.
type UrgentNotifier interface {
	// Urgent returns a channel that receives, without blocking the store,
	// after a check found a key near its limit.
	Urgent() <-chan struct{}
}

// Config configures a Core. Region, POP and Counts are required; a zero
// duration takes its default (Default*).
type Config struct {
	// Region and POP name this PoP; POP is its replica name.
	Region, POP string
	// Topology names every region and its PoPs; empty means this region is
	// the only one.
	Topology region.Topology
	Counts   Counts
	// Bits is the PoP's bit table; nil turns bits off: none are published
	// and received ones are not applied.
	Bits Bits

	FlushInterval, SnapshotInterval, HelloInterval time.Duration
	// BitsInterval is the least time between two publications of bits on
	// issue, and between two urgent flushes.
	BitsInterval time.Duration
	// UnreachableAfter is how long without a beacon before a region counts
	// as cut off.
	UnreachableAfter time.Duration
	// PartitionShare is the share of a global limit each reachable region
	// enforces while others are cut off; 0 means reachable/total
	// (region.Share).
	PartitionShare float64
	// Bounds, when set, bounds received counts and bits' ends (check.go).
	Bounds Bounds
	// NoClockSync turns the PoPs' clock agreement off (clock.go): the PoP
	// then decides on its raw clock and Ready never moves it.
	NoClockSync bool
	// MaxClockStep bounds the clock correction: a PoP never moves its clock
	// further than this from its raw clock, and ignores offsets past it.
	MaxClockStep time.Duration
}

// ErrConfig is wrapped by New's errors.
var ErrConfig = errors.New("replication core: invalid config")

func (c *Config) validate() error {
	if c.Region == "" || c.POP == "" {
		return fmt.Errorf("%w: region %q and PoP %q must both be named", ErrConfig, c.Region, c.POP)
	}
	if c.Counts == nil {
		return fmt.Errorf("%w: no Counts", ErrConfig)
	}
	if len(c.Topology.Regions) > 0 {
		if _, ok := c.Topology.Regions[c.Region]; !ok {
			return fmt.Errorf("%w: region %q is not in the topology", ErrConfig, c.Region)
		}
		if r := c.Topology.RegionOf(c.POP); r != "" && r != c.Region {
			return fmt.Errorf("%w: PoP %q is in region %q in the topology, not %q", ErrConfig, c.POP, r, c.Region)
		}
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.FlushInterval, DefaultFlushInterval},
		{&c.SnapshotInterval, DefaultSnapshotInterval},
		{&c.HelloInterval, DefaultHelloInterval},
		{&c.BitsInterval, DefaultBitsInterval},
		{&c.UnreachableAfter, DefaultUnreachableAfter},
		{&c.MaxClockStep, DefaultMaxClockStep},
	} {
		if *d.v < 0 {
			return fmt.Errorf("%w: negative duration %v", ErrConfig, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.PartitionShare < 0 || c.PartitionShare > 1 {
		return fmt.Errorf("%w: partition share %v is not between 0 and 1", ErrConfig, c.PartitionShare)
	}
	return nil
}

type cellKey struct {
	key    string
	window int64
}

// never is a deadline that does not come.
const never = int64(math.MaxInt64)

// Core is one PoP's replication protocol. Its zero value is not usable; use
// New. A Core is not safe for concurrent use: its driver serialises every
// call.
type Core struct {
	cfg Config

	seq, helloSeq                  uint64
	nextFlush, nextSnap, nextHello int64
	lastBits, bitsDue              int64 // bitsDue is never when not armed
	lastUrgent, urgentDue          int64
	lastSnapshot                   int64
	snapshotWanted                 bool
	retry                          map[cellKey]uint64
	ownBits, retryBits             crdt.Bits
	heard                          map[string]uint64 // PoP -> its last beacon number
	gapAt                          map[string]int64  // PoP -> until when its gap snapshots are spent (Core.missed)
	reach                          *region.Reachability
	unreachable                    []string
	share                          float64
	reviewed                       int64 // when review last ran
	rd                             Ready
	outstanding                    bool
	retryOverflows                 uint64
	clk                            clockSync
}

// New validates cfg, fills in its defaults and returns a Core started at now
// (unix ns): batch and beacon numbers count up from now, the first beacon is
// due at now and the first flush and snapshot one interval later.
func New(cfg Config, now int64) (*Core, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Core{
		cfg:          cfg,
		seq:          uint64(now),
		helloSeq:     uint64(now),
		nextFlush:    now + int64(cfg.FlushInterval),
		nextSnap:     now + int64(cfg.SnapshotInterval),
		nextHello:    now,
		lastBits:     math.MinInt64 / 2,
		bitsDue:      never,
		lastUrgent:   math.MinInt64 / 2,
		urgentDue:    never,
		lastSnapshot: math.MinInt64 / 2,
		heard:        make(map[string]uint64),
		gapAt:        make(map[string]int64),
		reach:        region.NewReachability(cfg.Topology, cfg.Region, now),
		share:        1,
		reviewed:     now,
	}
	c.clk = newClockSync(&c.cfg)
	return c, nil
}

// Config returns the core's configuration with its defaults filled in.
func (c *Core) Config() Config { return c.cfg }

// multiRegion says whether the core tracks other regions' reachability.
func (c *Core) multiRegion() bool { return c.reach.Regions() > 1 }

// after returns the first instant next + k·iv (k ≥ 1) after now: missed
// intervals are skipped and the phase kept, as a time.Ticker does.
func after(next, now int64, iv time.Duration) int64 {
	return next + ((now-next)/int64(iv)+1)*int64(iv)
}

// Tick tells the core the time is now (unix ns); it does what is due.
//
// Every now the core is given is the PoP's clock: its raw clock plus the
// correction of the last Ready that moved it (Ready.ClockOffset), the clock
// the PoP's store decides on. The core takes the correction back out for the
// beacons' timestamps.
func (c *Core) Tick(now int64) {
	if now >= c.nextHello {
		c.helloSeq++
		raw := now - c.clk.offset
		c.send(Message{Kind: Hello, Seq: c.helloSeq, Sent: raw, Echo: c.clk.echoes(raw, 4*int64(c.cfg.HelloInterval))})
		c.nextHello = after(c.nextHello, now, c.cfg.HelloInterval)
	}
	if now >= c.nextSnap {
		c.snapshot(now)
		c.nextSnap = after(c.nextSnap, now, c.cfg.SnapshotInterval)
	}
	if now >= c.nextFlush {
		if c.snapshotWanted && now-c.lastSnapshot >= int64(c.cfg.HelloInterval) {
			c.snapshotWanted = false
			c.snapshot(now)
		}
		c.flushBits(now)
		c.flushDelta(now)
		c.rd.SaveDue = true
		c.nextFlush = after(c.nextFlush, now, c.cfg.FlushInterval)
	}
	if now >= c.bitsDue {
		c.bitsDue, c.lastBits = never, now
		c.flushBits(now)
	}
	if now >= c.urgentDue {
		c.urgentDue, c.lastUrgent = never, now
		c.flushDelta(now)
	}
	c.review(now)
}

// NextDeadline returns the unix ns at which Tick next has something to do.
// It moves earlier only through BitsIssued, Urgent and Step.
func (c *Core) NextDeadline() int64 {
	d := min(c.nextFlush, c.nextSnap, c.nextHello, c.bitsDue, c.urgentDue)
	if c.multiRegion() {
		d = min(d, c.reach.NextChange(c.reviewed, int64(c.cfg.UnreachableAfter)))
	}
	return d
}

// Flush publishes the delta and pending bits at now, whatever is due; a
// driver calls it once more when it stops.
func (c *Core) Flush(now int64) {
	c.flushBits(now)
	c.flushDelta(now)
	c.rd.SaveDue = true
}

// BitsIssued tells the core that the bit table issued a bit at now: the
// bits go at once, or, within BitsInterval of the last such publication,
// once the interval has passed.
func (c *Core) BitsIssued(now int64) {
	if c.cfg.Bits != nil && c.soon(now, &c.lastBits, &c.bitsDue) {
		c.flushBits(now)
	}
}

// Urgent tells the core that the store found a key near its limit at now:
// the delta goes at once, or, within BitsInterval of the last urgent flush,
// once the interval has passed.
func (c *Core) Urgent(now int64) {
	if c.soon(now, &c.lastUrgent, &c.urgentDue) {
		c.flushDelta(now)
	}
}

// soon rate-limits news to one publication per BitsInterval: it says
// whether to publish at now (and notes it in *last), or arms *due for when
// the interval has passed. Tick publishes at *due.
func (c *Core) soon(now int64, last, due *int64) bool {
	if *due != never {
		return false
	}
	if at := *last + int64(c.cfg.BitsInterval); now < at {
		*due = at
		return false
	}
	*last = now
	return true
}

// Failed tells the core that m, a message of a Ready, was not published or
// not acknowledged: a delta's slots and a bits batch's bits join the next
// flush (the latest value wins); a snapshot is not repeated before the next
// one is due.
func (c *Core) Failed(m Message) {
	switch m.Kind {
	case Delta:
		c.keep(m.Slots)
	case BitsBatch:
		c.retryBits.Join(m.Bits...)
	}
}

// HasReady says whether Ready has something, and the last Ready was advanced.
func (c *Core) HasReady() bool { return !c.outstanding && !c.rd.empty() }

// Ready returns what the driver must do now and starts a new one. Call
// Advance once it is done, before the next Ready.
func (c *Core) Ready() Ready {
	rd := c.rd
	c.rd = Ready{}
	c.outstanding = true
	return rd
}

// Advance tells the core the driver has done rd.
func (c *Core) Advance(rd Ready) {
	_ = rd
	c.outstanding = false
}

// Stats returns the core's counters.
func (c *Core) Stats() Stats {
	return Stats{RetrySlots: len(c.retry), RetryBits: c.retryBits.Len(), RetryOverflows: c.retryOverflows}
}

// Unreachable returns, sorted, the other regions not heard within `within`
// of now.
func (c *Core) Unreachable(now int64, within time.Duration) []string {
	return c.reach.Unreachable(now, int64(within))
}

func (c *Core) send(m Message) {
	m.Region, m.POP = c.cfg.Region, c.cfg.POP
	if m.Kind != Hello {
		m.Seq = c.seq
		c.seq++
	}
	c.rd.Messages = append(c.rd.Messages, m)
}

// flushDelta takes the store's delta, joins the retry set into it, and
// publishes it once saved.
func (c *Core) flushDelta(now int64) {
	var delta []crdt.Slot
	if ca, ok := c.cfg.Counts.(CountsAt); ok {
		delta = ca.DeltaAt(now)
	} else {
		delta = c.cfg.Counts.Delta()
	}
	slots := c.mergeRetry(delta)
	if len(slots) == 0 {
		return
	}
	slots = slices.Clip(slots)
	c.rd.Save = append(slices.Clip(c.rd.Save), slots...)
	if len(c.rd.Save) == len(slots) {
		c.rd.Save = slots
	}
	c.send(Message{Kind: Delta, Sent: now, Slots: slots})
}

// flushBits publishes the bits issued since the last call, joined with
// those whose publish failed, except the expired ones.
func (c *Core) flushBits(now int64) {
	if c.cfg.Bits == nil {
		return
	}
	delta := c.cfg.Bits.BitsDelta()
	c.ownBits.Join(delta...)
	c.retryBits.Join(delta...)
	if c.retryBits.Len() == 0 {
		return
	}
	c.retryBits.Expire(now)
	pending := c.retryBits.All()
	c.retryBits = crdt.Bits{}
	if len(pending) == 0 {
		return
	}
	c.send(Message{Kind: BitsBatch, Sent: now, Bits: pending})
}

// snapshot publishes the PoP's own counts and active bits. It reads Own
// before it flushes the delta, so that the save of that delta covers every
// count the snapshot carries.
func (c *Core) snapshot(now int64) {
	c.lastSnapshot = now
	var own []crdt.Slot
	if ca, ok := c.cfg.Counts.(CountsAt); ok {
		own = ca.OwnAt(now)
	} else {
		own = c.cfg.Counts.Own()
	}
	c.flushDelta(now)
	var bits []crdt.Bit
	if c.cfg.Bits != nil {
		c.ownBits.Expire(now)
		bits = c.ownBits.Active(now)
	}
	if len(own) == 0 && len(bits) == 0 {
		return
	}
	c.send(Message{Kind: Snapshot, Sent: now, Slots: own, Bits: bits})
}

// keep adds slots to the retry set, keeping the larger count per (key,
// window). When the set outgrows maxRetrySlots it is dropped and a snapshot
// replaces it.
func (c *Core) keep(slots []crdt.Slot) {
	if c.retry == nil {
		c.retry = make(map[cellKey]uint64)
	}
	for _, s := range slots {
		k := cellKey{s.Key, s.Window}
		c.retry[k] = max(c.retry[k], s.Count)
	}
	if len(c.retry) > maxRetrySlots {
		c.retry = nil
		c.retryOverflows++
		c.snapshotWanted = true
	}
}

// mergeRetry joins the retry set into slots (per-slot maximum) and empties
// it; the retried slots not in slots follow, sorted by window and key.
func (c *Core) mergeRetry(slots []crdt.Slot) []crdt.Slot {
	if len(c.retry) == 0 {
		return slots
	}
	for i, s := range slots {
		k := cellKey{s.Key, s.Window}
		if n, ok := c.retry[k]; ok {
			slots[i].Count = max(s.Count, n)
			delete(c.retry, k)
		}
	}
	from := len(slots)
	for k, n := range c.retry {
		slots = append(slots, crdt.Slot{Key: k.key, Window: k.window, Replica: c.cfg.POP, Count: n})
	}
	slices.SortFunc(slots[from:], func(a, b crdt.Slot) int {
		return cmp.Or(cmp.Compare(a.Window, b.Window), cmp.Compare(a.Key, b.Key))
	})
	c.retry = nil
	return slots
}
