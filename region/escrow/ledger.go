package escrow

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Errors the Ledger returns.
var (
	// ErrConfig is wrapped by the errors New returns for a Config it
	// cannot use.
	ErrConfig = errors.New("escrow: bad config")
	// ErrUnknownReplica is wrapped when news or an item names a replica
	// outside the scope.
	ErrUnknownReplica = errors.New("escrow: unknown replica")
	// ErrNotOwn is wrapped when Restore is handed another replica's item.
	ErrNotOwn = errors.New("escrow: item of another replica")
)

// Config names one scope of one replica: the replicas whose admissions one
// bounded limit sums (a region's PoPs for a region limit, every PoP for a
// global one) and which of them this one is.
type Config struct {
	// Self is this replica's name; it must be one of Replicas.
	Self string
	// Replicas are the scope's replicas, Self included, in any order;
	// names are unique, 1 to MaxName bytes, with no zero byte. Every
	// replica of the scope must be configured with the same set.
	Replicas []string
	// Incarnation is the instant (unix ns) this process started. Windows
	// that began before it start with no share here, whatever state was
	// restored (see the package doc, "Crash"). A driver passes the wall
	// clock at start; a test may pass any instant.
	Incarnation int64
	// Scale is the number of units a limit is divided into, at least
	// len(Replicas) and at most MaxScale; 0 means DefaultScale.
	Scale uint64
}

// News is what a message from a replica says besides its items: who sent
// it, which incarnation of that replica, and its watermark — "everything I
// admitted and gave up to my time SentAt is in what I have published".
// Every message carries it: deltas, empty flushes, presence beacons.
type News struct {
	From        string
	Incarnation int64 // the sender's Config.Incarnation
	SentAt      int64 // the sender's clock when it took the items, unix ns
	// Partial news proves the sender alive at SentAt but claims no
	// watermark: the message may not carry everything up to SentAt (a
	// delta on a transport that may lose one before it). It steers gives
	// (Rebalance gives only to replicas heard from within a window) and
	// never makes a count final.
	Partial bool
}

// Ledger is one replica's bookkeeping for the bounded limits of one scope:
// for every key and window it has heard of, every replica's count, requested
// hits and gives as last heard (its own exactly), and from those the
// allowance this replica may admit within. See the package doc for the model
// and why the sum of what the replicas admit never passes a limit.
//
// A Ledger is a value: it reads no clock and does no IO; every instant is an
// argument, every output a return value. Instants passed to it are treated
// as never going backwards: an instant older than one already seen is taken
// as the newest seen. The zero Ledger is not usable; use New. A Ledger is not
// safe for concurrent use.
type Ledger struct {
	self    int
	names   []string
	index   map[string]int
	scale   uint64
	share   uint64 // every replica's start share, Scale/N
	rem     uint64 // Scale − N·share, added to the first replica's start share
	minGive uint64 // the smallest give published
	band    uint64 // hysteresis: a replica gives only above target+band

	inc   []int64 // every replica's incarnation as heard (own: Config)
	heard []int64 // every replica's watermark as heard (own: unused)
	alive []int64 // every replica's latest news, partial or not (own: unused)

	entries map[entryKey]*entry
	dirty   []*entry

	// The keys Rebalance looks at (see Rebalance, "Which keys"): active
	// ones each time, and the keys set aside until a window boundary.
	active map[string]Spec
	wake   map[int64]map[string]Spec // by the boundary instant

	latest  int64 // the newest instant seen
	horizon int64 // the newest instant passed to Prune
	pruned  bool  // Prune was called
	acting  bool  // Decide or Rebalance ran; the own bases are set

	// The current windows' entries whose gives may have changed since the
	// last Wanted or Rebalance: another replica's demand grew, or
	// allowance arrived (see Wanted).
	touched map[entryKey]struct{}

	// scratch for Rebalance, len N each
	demand, target, deficit []uint64
}

type entryKey struct {
	key    string
	window int64
}

// entry is what a Ledger knows of one (key, window).
type entry struct {
	key    string
	window int64
	spec   Spec

	// per replica, as heard (own exactly): count C, requested R, the sum
	// of its out-gives, the sum of gives to it (any target incarnation)
	count, req, out, in []uint64

	inOwn uint64 // gives to this replica tagged with its own incarnation

	// Own count and out-gives of a window that began before this
	// incarnation, as they stood when this incarnation started acting:
	// they belong to the previous incarnation (see held).
	baseCount, baseOut uint64

	gives []giveRec // every give heard for this (key, window)

	dirty bool // own items changed since the last Delta
	gone  bool // pruned
}

// giveRec is the counter give(from→to@toInc).
type giveRec struct {
	from, to int
	toInc    int64
	value    uint64
}

// New returns an empty Ledger for cfg, or an error wrapping ErrConfig.
func New(cfg Config) (*Ledger, error) {
	scale := cfg.Scale
	if scale == 0 {
		scale = DefaultScale
	}
	names := slices.Clone(cfg.Replicas)
	slices.Sort(names)
	n := len(names)
	switch {
	case n == 0:
		return nil, fmt.Errorf("%w: no replicas", ErrConfig)
	case scale < uint64(n) || scale > MaxScale:
		return nil, fmt.Errorf("%w: scale %d not in %d…%d", ErrConfig, scale, n, uint64(MaxScale))
	}
	l := &Ledger{
		self:    -1,
		names:   names,
		index:   make(map[string]int, n),
		scale:   scale,
		share:   scale / uint64(n),
		inc:     make([]int64, n),
		heard:   make([]int64, n),
		alive:   make([]int64, n),
		entries: make(map[entryKey]*entry),
		active:  make(map[string]Spec),
		wake:    make(map[int64]map[string]Spec),
		touched: make(map[entryKey]struct{}),
		latest:  math.MinInt64,
		demand:  make([]uint64, n),
		target:  make([]uint64, n),
		deficit: make([]uint64, n),
	}
	l.rem = scale - l.share*uint64(n)
	for i, name := range names {
		if err := validName(name); err != nil {
			return nil, fmt.Errorf("%w: replica %d: %w", ErrConfig, i, err)
		}
		if i > 0 && names[i-1] == name {
			return nil, fmt.Errorf("%w: replica %q named twice", ErrConfig, name)
		}
		l.index[name] = i
		l.inc[i] = math.MinInt64
		l.heard[i] = math.MinInt64
		l.alive[i] = math.MinInt64
		if name == cfg.Self {
			l.self = i
		}
	}
	if l.self < 0 {
		return nil, fmt.Errorf("%w: self %q is not one of the replicas %s", ErrConfig, cfg.Self, strings.Join(names, ","))
	}
	l.inc[l.self] = cfg.Incarnation
	l.minGive = max(1, scale/256)
	l.band = max(l.minGive, l.share/8)
	return l, nil
}

// Replicas returns the scope's replicas, sorted.
func (l *Ledger) Replicas() []string { return slices.Clone(l.names) }

// Self returns this replica's name.
func (l *Ledger) Self() string { return l.names[l.self] }

// Scale returns the number of units a limit is divided into.
func (l *Ledger) Scale() uint64 { return l.scale }

// clock returns now, or the newest instant seen if now is older.
func (l *Ledger) clock(now int64) int64 {
	if now < l.latest {
		return l.latest
	}
	l.latest = now
	return now
}

// act marks the start of this incarnation's own decisions. Own counts and
// out-gives already held for windows that began before the incarnation —
// restored or relayed back — are the previous incarnation's: they are set
// aside as bases, so they neither count against nor add to what this one
// holds (see held).
func (l *Ledger) act() {
	if l.acting {
		return
	}
	l.acting = true
	for _, e := range l.entries {
		if e.window < l.inc[l.self] {
			e.baseCount = e.count[l.self]
			e.baseOut = e.out[l.self]
		}
	}
}

// startShare is replica k's start share of a window beginning at w, as this
// ledger knows k's incarnation: Scale/N (the remainder to the first
// replica), or 0 for a window that began before k's incarnation.
func (l *Ledger) startShare(k int, w int64) uint64 {
	if w < l.inc[k] {
		return 0
	}
	if k == 0 {
		return l.share + l.rem
	}
	return l.share
}

// isPruned reports whether a window starting at w of length win is older
// than the previous window at the newest instant passed to Prune.
func (l *Ledger) isPruned(w, win int64) bool {
	return l.pruned && w < windowStart(l.horizon, win)-win
}

// entryFor returns the entry of (key, w), creating it with spec if create is
// set; nil if it is absent, or pruned. key may be borrowed (a caller's bytes
// seen as a string): a new entry keeps a copy.
func (l *Ledger) entryFor(key string, w int64, spec Spec, create bool) *entry {
	if e := l.entries[entryKey{key, w}]; e != nil || !create {
		return e
	}
	if l.isPruned(w, spec.Window) {
		return nil
	}
	key = strings.Clone(key)
	n := len(l.names)
	vals := make([]uint64, 4*n)
	e := &entry{
		key: key, window: w, spec: spec,
		count: vals[0:n:n], req: vals[n : 2*n : 2*n], out: vals[2*n : 3*n : 3*n], in: vals[3*n : 4*n],
	}
	l.entries[entryKey{key, w}] = e
	return e
}

func (l *Ledger) markDirty(e *entry) {
	if !e.dirty {
		e.dirty = true
		l.dirty = append(l.dirty, e)
	}
}

// held is this replica's fraction of e's window, in units: its start share
// plus the gives it has heard of minus its own out-gives, at least 0 and at
// most Scale. In a window that began before this incarnation the start share
// is 0, only gives addressed to this incarnation count, and only out-gives
// made by this incarnation (above the base) are subtracted: the previous
// incarnation is accounted as a replica of its own that used everything it
// held.
func (l *Ledger) held(e *entry) uint64 {
	s := l.self
	if e == nil {
		return 0
	}
	var f uint64
	if e.window >= l.inc[s] {
		f = subSat(addSat(l.startShare(s, e.window), e.in[s]), e.out[s])
	} else {
		f = subSat(e.inOwn, subSat(e.out[s], e.baseOut))
	}
	return min(f, l.scale)
}

// ownUsed is the count this incarnation admitted in e's window.
func (l *Ledger) ownUsed(e *entry) uint64 {
	if e.window >= l.inc[l.self] {
		return e.count[l.self]
	}
	return subSat(e.count[l.self], e.baseCount)
}

// eScale is the resolution of the elapsed fraction of a sliding window.
const eScale = 1 << 16

// room returns the allowance rule of e's window at now as a ratio: this
// replica may admit while its count C satisfies C·d ≤ f·x, f its held
// fraction in units. Fixed window: d = Scale, x = L. Sliding window:
// d = Scale·2¹⁶, x = L·2¹⁶ − P̂·(2¹⁶ − ê), where ê = ⌊elapsed·2¹⁶/W⌋ rounds
// the elapsed fraction down, so that (1 − ê/2¹⁶) ≥ (1 − e) and the room
// is never overstated; x is 0 when P̂ fills it.
func (l *Ledger) room(e *entry, now int64) (d, x uint64) {
	lim := uint64(e.spec.Limit)
	if !e.spec.Sliding {
		return l.scale, lim
	}
	el := now - e.window
	if el < 0 {
		el = 0
	}
	ehat := mulDiv(uint64(el), eScale, uint64(e.spec.Window))
	ehat = min(ehat, eScale)
	p := l.prevBound(e.key, e.window, e.spec)
	return l.scale * eScale, subSat(lim*eScale, mulSat(p, eScale-ehat))
}

// mulSat returns a·b, or math.MaxUint64 if the product overflows.
func mulSat(a, b uint64) uint64 {
	if a != 0 && b > math.MaxUint64/a {
		return math.MaxUint64
	}
	return a * b
}

// final reports whether replica k's count of the window [pw, w) can no
// longer grow as far as this ledger knows: k's incarnation began no later
// than pw (no earlier incarnation admitted in it unseen) and, for another
// replica, news of k sent at or after w has been applied.
func (l *Ledger) final(k int, pw, w int64) bool {
	return l.inc[k] <= pw && (k == l.self || l.heard[k] >= w)
}

// prevBound is P̂: an upper bound of the total count of the window before w,
// all replicas together. A replica whose count is final adds its count; the
// others together cannot have admitted more than the fractions they can
// hold allow, and those are at most Scale minus what the final replicas
// hold at least — f̲_k = start + gives heard to k − k's out-gives, exact in
// its out-gives because k's news covers every give it made for that window.
// It costs O(N).
func (l *Ledger) prevBound(key string, w int64, spec Spec) uint64 {
	pw := w - spec.Window
	p := l.entries[entryKey{key, pw}]
	var sumP, sumF uint64
	for k := range l.names {
		if !l.final(k, pw, w) {
			continue
		}
		start := l.startShare(k, pw)
		if p == nil {
			sumF = addSat(sumF, start)
			continue
		}
		sumP = addSat(sumP, p.count[k])
		sumF = addSat(sumF, subSat(addSat(start, p.in[k]), p.out[k]))
	}
	lim := uint64(spec.Limit)
	rest := mulDivCeil(lim, subSat(l.scale, sumF), l.scale)
	return addSat(sumP, min(subSat(lim, sumP), rest))
}

// Decide reports whether this replica admits hits more hits of key at now
// under spec, and what it may still admit of the window after this decision.
// It always adds hits to the replica's requested count R, and adds them to
// its count C when it admits them. It admits iff
//
//	fixed:   C + hits ≤ f·L/Scale
//	sliding: C + hits ≤ f/Scale · (L − P̂·(1 − e))
//
// with f the fraction this replica holds of the window (held), e the elapsed
// fraction at now (rounded down) and P̂ an upper bound of the previous
// window's total. A hits of 0 is a peek: it counts nothing, publishes
// nothing, and returns the room (what hits may be admitted now) as
// remaining. A negative hits or an invalid spec is denied with nothing
// counted.
//
// A request that several limits decide together (every limit must admit it)
// goes through its bounded limits in three steps, so that each counts as
// admitted (C) only hits the request got, and as demand (R) every hit asked
// of it:
//
//  1. Peek: Decide(now, key, spec, 0) for each bounded limit; it has room
//     for the request iff hits ≤ remaining.
//  2. Decide the whole request, over these and the request's other limits.
//  3. If it is admitted, Decide(now, key, spec, hits) for each bounded
//     limit: it admits, since nothing changed since the peek. If it is
//     denied, Request(now, key, spec, hits) for each: the hits count as
//     demand (R) only, whether this limit had room or not — a limit without
//     room would have counted them the same way by denying.
//
// Pass the same now to every step, and call nothing else on the Ledger
// between the peek and the last step (a driver holds it for the request).
//
// Decide costs O(1) for a fixed window and O(N) for a sliding one; it
// allocates only for the first decision of a (key, window).
func (l *Ledger) Decide(now int64, key string, spec Spec, hits int64) (allowed bool, remaining int64) {
	if hits < 0 || spec.Limit <= 0 || spec.Limit > MaxLimit || spec.Window <= 0 {
		return false, 0
	}
	now = l.clock(now)
	l.act()
	e := l.entryFor(key, windowStart(now, spec.Window), spec, true)
	if e == nil {
		return false, 0
	}
	e.spec = spec
	h := uint64(hits)
	if h > 0 {
		e.req[l.self] = addSat(e.req[l.self], h)
		l.markDirty(e)
	}
	d, x := l.room(e, now)
	limit := mulDiv(l.held(e), x, d)
	used := l.ownUsed(e)
	if used > limit || h > limit-used {
		return false, int64(subSat(limit, used))
	}
	e.count[l.self] += h
	return true, int64(limit - used - h)
}

// Request counts hits of key at now under spec as requested only: it adds
// them to this replica's requested count R — the demand that Rebalance
// moves allowance toward, published by the next Delta — and never to its
// count C. It is for a request that another limit denied while this one had
// room (see Decide's steps): the request did not get the hits, so they must
// not use this limit's allowance, but its client asked for them here, so
// they are demand. On a limit without room it counts exactly what a denying
// Decide would. A hits of 0 or less, or an invalid spec, counts nothing.
func (l *Ledger) Request(now int64, key string, spec Spec, hits int64) {
	if hits <= 0 || spec.Validate() != nil {
		return
	}
	now = l.clock(now)
	l.act()
	e := l.entryFor(key, windowStart(now, spec.Window), spec, true)
	if e == nil {
		return
	}
	e.spec = spec
	e.req[l.self] = addSat(e.req[l.self], uint64(hits))
	l.markDirty(e)
}

// Held returns the fraction, in units of 1/Scale of the limit, that this
// replica holds of the window of key under spec that starts at window: what
// Decide admits within. It is 0 for a window Prune dropped.
func (l *Ledger) Held(key string, spec Spec, window int64) uint64 {
	e := l.entries[entryKey{key, window}]
	switch {
	case e != nil:
		return l.held(e)
	case l.isPruned(window, spec.Window):
		return 0
	}
	return l.startShare(l.self, window)
}

// Apply joins what a replica published — items of any replica, each joined
// by keeping the largest value per identity — and then its news (Heard).
// Items must come before the news they travel with, and the watermark of a
// replica k's news must only be applied once every item k published up to
// SentAt has been (the driver's contract: a stream without gaps, or a full
// snapshot of k's items). Own items relayed back are joined like any other:
// a larger own value than held can only lower what this replica may admit.
//
// Apply joins every valid item and returns an error, wrapping ErrBadItem or
// ErrUnknownReplica, naming the items it refused: malformed ones, ones of a
// replica outside the scope, a count over its limit.
// Items of windows older than the previous one at the last Prune are
// ignored.
func (l *Ledger) Apply(n News, items []Item) error {
	var errs []error
	for _, it := range items {
		if err := l.join(it); err != nil && len(errs) < 4 {
			errs = append(errs, err)
		}
	}
	if err := l.Heard(n); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Heard applies news without items (a beacon, an empty flush): the sender's
// watermark and incarnation, each kept at the largest heard. News from this
// replica itself is ignored.
func (l *Ledger) Heard(n News) error {
	k, ok := l.index[n.From]
	if !ok {
		return fmt.Errorf("%w: news from %q", ErrUnknownReplica, n.From)
	}
	if k == l.self {
		return nil
	}
	l.inc[k] = max(l.inc[k], n.Incarnation)
	l.alive[k] = max(l.alive[k], n.SentAt)
	if !n.Partial {
		l.heard[k] = max(l.heard[k], n.SentAt)
	}
	return nil
}

// Restore joins the items this replica saved before it restarted. Call it
// before the first Decide or Rebalance: what it restores for windows that
// began before Config.Incarnation is the previous incarnation's (counted
// and given by it) and is set aside when this one starts acting. Items of
// other replicas are refused with ErrNotOwn; use Apply for them.
func (l *Ledger) Restore(items []Item) error {
	var errs []error
	for _, it := range items {
		if it.Replica != l.names[l.self] {
			if len(errs) < 4 {
				errs = append(errs, fmt.Errorf("%w: %v", ErrNotOwn, it))
			}
			continue
		}
		if err := l.join(it); err != nil && len(errs) < 4 {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// join merges one item.
func (l *Ledger) join(it Item) error {
	if err := it.Validate(); err != nil {
		return err
	}
	o, ok := l.index[it.Replica]
	if !ok {
		return fmt.Errorf("%w: %v", ErrUnknownReplica, it)
	}
	to := -1
	switch it.Kind {
	case Count:
		if it.Value > uint64(it.Spec.Limit) {
			return fmt.Errorf("%w: count over the limit: %v", ErrBadItem, it)
		}
	case Give:
		if to, ok = l.index[it.To]; !ok {
			return fmt.Errorf("%w: %v", ErrUnknownReplica, it)
		}
	}
	e := l.entryFor(it.Key, it.Window, it.Spec, true)
	if e == nil {
		return nil
	}
	switch it.Kind {
	case Count:
		e.count[o] = max(e.count[o], it.Value)
	case Requested:
		if it.Value > e.req[o] && o != l.self {
			l.active[e.key] = e.spec // another replica's demand: targets move
			l.touch(e)
		}
		e.req[o] = max(e.req[o], it.Value)
	case Give:
		if to == l.self && it.Value > l.given(e, o, to, it.ToIncarnation) {
			l.active[e.key] = e.spec // this replica holds more: it may have excess
			l.touch(e)
		}
		l.raiseGive(e, o, to, it.ToIncarnation, it.Value)
	}
	return nil
}

// touch notes that e's gives may have changed, for Wanted, if e is of a
// window at or after the newest instant seen: a past window's allowance is
// no use to anyone.
func (l *Ledger) touch(e *entry) {
	if l.latest == math.MinInt64 || e.window+e.spec.Window > l.latest {
		l.touched[entryKey{e.key, e.window}] = struct{}{}
	}
}

// Wanted reports whether, since the last call (or Rebalance), something was
// heard after which a Rebalance would give: another replica's demand for a
// key grew, or allowance arrived here, and this replica now holds more of
// the key's current window than its demand-proportional target, unused,
// while another replica is below its own (see Rebalance). A driver that can
// flush early (a store's urgent signal) does so, so that allowance reaches a
// replica that asks for it in one message's delay rather than a flush
// interval's — before it runs out, not after it has denied. It only steers
// timing; no decision depends on it. It costs O(N) for each key heard of
// since the last call. It takes as now the newest instant seen or heard:
// the others' news says when they sent it, and a replica that has not
// decided yet knows the time from nothing else.
func (l *Ledger) Wanted() bool {
	w := false
	now := l.latest
	for k, at := range l.alive {
		if k != l.self {
			now = max(now, at)
		}
	}
	for k := range l.touched {
		if e := l.entries[k]; !w && e != nil && windowStart(now, e.spec.Window) == e.window {
			w = l.wouldGive(now, e)
		}
	}
	clear(l.touched)
	return w
}

// given returns give(from→to@toInc) of e as heard.
func (l *Ledger) given(e *entry, from, to int, toInc int64) uint64 {
	for _, g := range e.gives {
		if g.from == from && g.to == to && g.toInc == toInc {
			return g.value
		}
	}
	return 0
}

// raiseGive sets give(from→to@toInc) of e to v if v is larger than held,
// keeping the sums of gives in and out in step.
func (l *Ledger) raiseGive(e *entry, from, to int, toInc int64, v uint64) {
	i := slices.IndexFunc(e.gives, func(g giveRec) bool { return g.from == from && g.to == to && g.toInc == toInc })
	if i < 0 {
		e.gives = append(e.gives, giveRec{from: from, to: to, toInc: toInc})
		i = len(e.gives) - 1
	}
	g := &e.gives[i]
	if v <= g.value {
		return
	}
	d := v - g.value
	g.value = v
	e.out[from] = addSat(e.out[from], d)
	e.in[to] = addSat(e.in[to], d)
	if to == l.self && toInc == l.inc[l.self] {
		e.inOwn = addSat(e.inOwn, d)
	}
}

// giveTo returns give(self→to@toInc) of e.
func (l *Ledger) giveTo(e *entry, to int, toInc int64) uint64 {
	return l.given(e, l.self, to, toInc)
}

// Delta returns the news to send and this replica's own items — counts,
// requested hits, gives, each absolute — of every (key, window) that changed
// since the last Delta, and forgets that they changed. The driver saves the
// items (the gives at least) before it publishes them with the news; if
// saving fails it must not publish, and should publish Own later instead.
func (l *Ledger) Delta(now int64) (News, []Item) {
	var items []Item
	for _, e := range l.dirty {
		e.dirty = false
		if !e.gone {
			items = l.appendOwn(items, e)
		}
	}
	clear(l.dirty)
	l.dirty = l.dirty[:0]
	slices.SortFunc(items, compareItems)
	return l.news(now), items
}

// Own returns the news to send and all of this replica's own items held: a
// full snapshot for anti-entropy, or for a transport that may lose messages.
func (l *Ledger) Own(now int64) (News, []Item) {
	var items []Item
	for _, e := range l.entries {
		items = l.appendOwn(items, e)
	}
	slices.SortFunc(items, compareItems)
	return l.news(now), items
}

func (l *Ledger) news(now int64) News {
	return News{From: l.names[l.self], Incarnation: l.inc[l.self], SentAt: now}
}

func (l *Ledger) appendOwn(items []Item, e *entry) []Item {
	s := l.self
	base := Item{Key: e.key, Window: e.window, Spec: e.spec, Replica: l.names[s]}
	if v := e.count[s]; v > 0 {
		it := base
		it.Kind, it.Value = Count, v
		items = append(items, it)
	}
	if v := e.req[s]; v > 0 {
		it := base
		it.Kind, it.Value = Requested, v
		items = append(items, it)
	}
	for _, g := range e.gives {
		if g.from == s && g.value > 0 {
			it := base
			it.Kind, it.To, it.ToIncarnation, it.Value = Give, l.names[g.to], g.toInc, g.value
			items = append(items, it)
		}
	}
	return items
}

// compareItems orders items by window, key, kind, replica, receiver.
func compareItems(a, b Item) int {
	switch {
	case a.Window != b.Window:
		return cmpInt(a.Window, b.Window)
	case a.Key != b.Key:
		return strings.Compare(a.Key, b.Key)
	case a.Kind != b.Kind:
		return int(a.Kind) - int(b.Kind)
	case a.Replica != b.Replica:
		return strings.Compare(a.Replica, b.Replica)
	case a.To != b.To:
		return strings.Compare(a.To, b.To)
	}
	return cmpInt(a.ToIncarnation, b.ToIncarnation)
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Prune drops every window older than the previous one at now, of each key
// by its own window length, and ignores any later item or decision for such
// a window, so that a late redelivery cannot bring one back with a fresh
// start share. It returns the number of (key, window)s dropped.
func (l *Ledger) Prune(now int64) int {
	if !l.pruned || now > l.horizon {
		l.horizon, l.pruned = now, true
	}
	dropped := 0
	for k, e := range l.entries {
		if l.isPruned(e.window, e.spec.Window) {
			e.gone = true
			delete(l.entries, k)
			dropped++
		}
	}
	return dropped
}

// Len returns the number of (key, window)s held.
func (l *Ledger) Len() int { return len(l.entries) }

// Step tells the ledger that the clock its callers pass as now stepped by
// d (ns), now being the new clock: the PoPs' clock agreement moved it. A
// step forward that carries the replica across the start of a key's window
// leaves hits it admitted in what the new clock calls that window counted
// in the window before, where they free room as that window slides out; the
// other replicas, whose clocks were right, counted the same stretch of time
// in the new window. So every hit this incarnation admitted in the window
// it was in before the step is counted in the window it is in after it as
// well: which of them fell after the new window's start cannot be told from
// counts, and counting them all errs toward denying, in the one window after
// a step. A step back needs nothing: the windows the replica is in only
// repeat, and Decide never goes back past the newest instant it saw.
func (l *Ledger) Step(now, d int64) {
	if d <= 0 || !l.acting {
		return // nothing admitted by this incarnation yet: nothing to move
	}
	var moved []*entry
	for _, e := range l.entries {
		w := e.spec.Window
		if e.gone || e.window != windowStart(now-d, w) || windowStart(now, w) <= e.window {
			continue
		}
		moved = append(moved, e)
	}
	for _, e := range moved { // not while ranging: entryFor adds entries
		used := l.ownUsed(e)
		if used == 0 {
			continue
		}
		ne := l.entryFor(e.key, windowStart(now, e.spec.Window), e.spec, true)
		if ne == nil {
			continue
		}
		ne.count[l.self] = addSat(ne.count[l.self], used)
		l.touch(ne)
		l.markDirty(ne)
	}
}
