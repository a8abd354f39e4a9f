package store

import (
	"errors"
	"slices"
	"strings"
	"unsafe"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/region/escrow"
)

// Bounded limits in the embedded store (limit.Bounded, `consistency:
// bounded`). A region or global window limit with that consistency is not
// decided on counts and an estimate: this PoP admits only within the
// allowance it holds of the key's window, and the allowances of every PoP of
// the scope never sum past the limit (region/escrow, whose package doc states
// the model and why it holds). The store keeps one escrow.Ledger per scope
// and is its driver:
//
//   - a check peeks at the room (Decide with no hits), decides the request
//     with every other item, then counts the hits (Decide) when the request
//     is admitted, or only the demand (Request) when it is not;
//   - every flush (DeltaAt), the ledgers move unused allowance toward demand
//     (Rebalance) and their own counters — counts, requested hits, gives —
//     travel as slots beside the ordinary counts (escrow.EncodeSlot), with
//     one slot of news: this PoP's incarnation. The replication driver saves
//     the delta before it publishes it, as the ledger requires of its gives;
//   - a snapshot (OwnAt) carries every own counter, so its news also carries
//     a watermark (everything admitted and given up to then is published),
//     from which the others take this PoP's count of a past window as final;
//   - received slots (ApplyAt) and restored ones (Restore) go to the ledger
//     of their key's scope, never into the sums of ordinary counts.
//
// A delta's news carries no watermark: deltas may be lost and the next one
// would then claim more than was applied. Until a snapshot after a window's
// end arrives, the sliding window counts that PoP's whole allowance of the
// previous window as used (escrow's P̂): a cost in denials early in a
// window, never an admission past the limit.

// bounded holds a replicating store's ledgers. Requires replicated.mu held
// for every method.
type bounded struct {
	region, global *escrow.Ledger
	refused        uint64 // received items a ledger refused (malformed, unknown replica)
	// arrived, when a check waits for allowance (awaits), is closed when
	// the next escrow counters or news are applied: gives, or a watermark
	// that shrinks P̂, may have made room.
	arrived chan struct{}
	// waiting holds, per key, the hits of the checks waiting on arrived:
	// together they wait only for what is coming.
	waiting map[string]int64
}

// closed is a channel closed from the start: room is there already.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// awaits returns a channel that is closed when waiting may let hits of the
// denied bounded item it be admitted — at once when there is room already —
// or nil when waiting brings nothing: what is coming to this PoP
// (escrow.Ledger.Coming) does not cover the hits beside those of the checks
// already waiting for the key since the last news.
func (b *bounded) awaits(it *limit.Item, now, hits int64) <-chan struct{} {
	l, key, sp := b.ledger(it.Scope), borrowKey(it), escrowSpec(&it.Spec)
	if hits <= 0 {
		return nil
	}
	if _, room := l.Decide(now, key, sp, 0); room >= hits {
		return closed
	}
	waiting := b.waiting[key]
	if l.Coming(now, key, sp) < waiting+hits {
		return nil
	}
	if b.arrived == nil {
		b.arrived = make(chan struct{})
		b.waiting = make(map[string]int64)
	}
	b.waiting[strings.Clone(key)] = waiting + hits
	return b.arrived
}

// newBounded returns the ledgers of replica self, whose region's other PoPs
// are regionPeers and the topology's PoPs replicas (self may be among them),
// started at incarnation (unix ns; see escrow.Config.Incarnation).
func newBounded(self string, regionPeers, replicas []string, incarnation int64) (*bounded, error) {
	scope := func(names ...[]string) (*escrow.Ledger, error) {
		all := []string{self}
		for _, ns := range names {
			all = append(all, ns...)
		}
		slices.Sort(all)
		return escrow.New(escrow.Config{Self: self, Replicas: slices.Compact(all), Incarnation: incarnation})
	}
	region, err := scope(regionPeers)
	if err != nil {
		return nil, err
	}
	global, err := scope(regionPeers, replicas)
	if err != nil {
		return nil, err
	}
	return &bounded{region: region, global: global}, nil
}

// ledger returns the ledger of scope sc (region or global).
func (b *bounded) ledger(sc limit.Scope) *escrow.Ledger {
	if sc == limit.ScopeRegion {
		return b.region
	}
	return b.global
}

// borrowKey is the item's key as a string without a copy: the ledger copies
// a key it keeps (escrow's entryFor), and the check does not outlive it.
func borrowKey(it *limit.Item) string { return unsafe.String(unsafe.SliceData(it.Key), len(it.Key)) }

// escrowSpec is the ledger's form of a window limit.
func escrowSpec(sp *limit.Spec) escrow.Spec {
	return escrow.Spec{Limit: sp.Limit, Window: sp.Window, Sliding: sp.Algorithm == limit.SlidingWindow}
}

// isBounded reports whether a replicated item is decided by the ledgers.
func isBounded(it *limit.Item) bool { return it.Consistency == limit.Bounded }

// state is the limit.State a bounded item decides on at now: a count that
// leaves exactly the room the ledger allows, so that limit.Decide admits
// hits iff they fit the allowance and reports what remains of it.
func (b *bounded) state(it *limit.Item, now int64) limit.State {
	_, room := b.ledger(it.Scope).Decide(now, borrowKey(it), escrowSpec(&it.Spec), 0)
	room = min(max(room, 0), it.Spec.Limit)
	return limit.State{Start: limit.WindowStart(now, it.Spec.Window), Unheard: float64(it.Spec.Limit - room)}
}

// settle counts a bounded item's hits once the request is decided: its
// admission when the request is admitted and it allowed it, its demand
// alone otherwise — once per check, not again when a check that waited for
// allowance is decided Again. It returns whether the hits were counted as
// admitted.
func (b *bounded) settle(it *limit.Item, now, hits int64, admitted bool) bool {
	l, key, sp := b.ledger(it.Scope), borrowKey(it), escrowSpec(&it.Spec)
	if admitted {
		if ok, _ := l.Decide(now, key, sp, hits); ok {
			return true
		}
		return false // not reached: nothing moved between the peek and now, under the lock
	}
	if hits <= it.Spec.Limit && !it.Again {
		// More hits than the limit never fit anywhere: no allowance can
		// serve them, so they are no demand (and the engine peeks so).
		l.Request(now, key, sp, hits)
	}
	return false
}

// flush moves allowance toward demand and returns the ledgers' own counters
// that changed, as slots, and this PoP's news (partial: see above).
func (b *bounded) flush(now int64) []crdt.Slot {
	var out []crdt.Slot
	var news escrow.News
	for _, l := range []*escrow.Ledger{b.region, b.global} {
		l.Rebalance(now)
		var items []escrow.Item
		news, items = l.Delta(now)
		for _, it := range items {
			out = append(out, escrow.EncodeSlot(it))
		}
	}
	if len(out) == 0 {
		return nil
	}
	news.Partial = true
	return append(out, escrow.EncodeNews(news))
}

// own returns every own counter of both ledgers, and news whose watermark is
// now: a snapshot.
func (b *bounded) own(now int64) []crdt.Slot {
	var out []crdt.Slot
	var news escrow.News
	for _, l := range []*escrow.Ledger{b.region, b.global} {
		var items []escrow.Item
		news, items = l.Own(now)
		for _, it := range items {
			out = append(out, escrow.EncodeSlot(it))
		}
	}
	return append(out, escrow.EncodeNews(news))
}

// isEscrow reports whether a received slot is the ledgers' (an escrow
// counter, or news) rather than an ordinary count.
func isEscrow(sl *crdt.Slot) bool { return escrow.IsSlot(*sl) || escrow.IsNews(*sl) }

// apply hands the escrow slots among slots, sent at sent (the sender's
// clock; 0 for restored ones), to the ledgers of their keys' scopes, news
// last, and returns the ordinary slots (slots itself when it
// holds no escrow slot, so that a store without bounded limits allocates
// nothing), and whether a ledger wants an early flush (escrow.Ledger.Wanted).
// Items or news a ledger refuses are counted in refused.
func (b *bounded) apply(slots []crdt.Slot, sent int64) (rest []crdt.Slot, wanted bool) {
	first := slices.IndexFunc(slots, func(sl crdt.Slot) bool { return isEscrow(&sl) })
	if first < 0 {
		return slots, false
	}
	rest = slices.Clone(slots[:first])
	var region, global []escrow.Item
	var news []escrow.News
	for i := first; i < len(slots); i++ {
		sl := &slots[i]
		switch {
		case escrow.IsNews(*sl):
			n, err := escrow.DecodeNews(*sl)
			if err != nil {
				b.refused++
				continue
			}
			if n.Partial {
				n.SentAt = sent // the message's send time: alive then
			}
			news = append(news, n)
		case escrow.IsSlot(*sl):
			it, err := escrow.DecodeSlot(*sl)
			if err != nil {
				b.refused++
				continue
			}
			if sc, ok := rules.KeyScope(it.Key); ok && sc == limit.ScopeRegion {
				region = append(region, it)
			} else {
				global = append(global, it)
			}
		default:
			rest = append(rest, *sl)
		}
	}
	join := func(l *escrow.Ledger, items []escrow.Item) {
		for i := range items { // one at a time: a refused item must not cost the others
			if err := l.Apply(escrow.News{From: items[i].Replica}, items[i:i+1]); err != nil && !errors.Is(err, escrow.ErrUnknownReplica) {
				b.refused++
			}
		}
	}
	join(b.region, region)
	join(b.global, global)
	if b.arrived != nil {
		close(b.arrived) // the waiting checks are decided again, and wait again if they may
		b.arrived, b.waiting = nil, nil
	}
	// Both: each call also clears its ledger's signal.
	wr, wg := b.region.Wanted(), b.global.Wanted()
	wanted = wr || wg
	for _, n := range news {
		// A PoP of another region is no replica of the region ledger.
		_ = b.region.Heard(n)
		if err := b.global.Heard(n); err != nil {
			b.refused++
		}
	}
	return rest, wanted
}
