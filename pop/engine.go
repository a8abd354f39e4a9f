package pop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/topkeys"
)

// Store is the counter store the engine decides against (store.Memory,
// store.Redis, store.Fallback). CheckAt evaluates items at now as one atomic
// step with the semantics of limit.Decide and writes one decision per item to
// out. An error means nothing was decided or counted.
type Store interface {
	CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error
}

// Bounds on a request; beyond them it is rejected with a RequestError.
const (
	MaxDescriptors = 64
	MaxEntries     = 16
	MaxKeyBytes    = 256
	MaxValueBytes  = 1024
	MaxDomainBytes = 256
	// MaxHits bounds hits_addend.
	MaxHits = 1 << 20
)

// Descriptor is one descriptor of a request: an ordered list of entries and,
// as in Envoy's RateLimitDescriptor, an optional hits_addend and limit of its
// own.
type Descriptor struct {
	Entries []rules.Entry `json:"entries"`
	// HitsAddend, when set, is how many hits this descriptor counts in place
	// of the request's HitsAddend. Zero is a check that counts nothing: the
	// status says whether one more hit would fit now (Envoy's "check only").
	HitsAddend *int64 `json:"hits_addend,omitempty"`
	// Limit, when set, replaces the limits the descriptor matches, for this
	// request only (Envoy's RateLimitDescriptor.limit). See Override.
	Limit *Override `json:"limit,omitempty"`
}

// Override is a request's own limit for one descriptor, Envoy's
// RateLimitDescriptor.RateLimitOverride. It replaces every limit the
// descriptor matches with one limit of RequestsPerUnit per Unit, counted as
// the first matched limit counts (algorithm, scope; burst becomes the new
// limit) and never in shadow mode, as Envoy's ratelimit does. The store key is
// the matched limit's own key for the override's unit, so an override with the
// rule's unit counts on the rule's counts, and one with another unit counts on
// its own (the store needs one window per key). A descriptor that matches no
// limit, or an unlimited one, of a known domain is limited by the override
// alone, counted at PoP scope under the policy name "override" with the
// engine's SetOverrideAlgorithm (the sliding window by default). An override
// never issues mitigation bits: its quota is the caller's, not the
// operator's.
type Override struct {
	RequestsPerUnit int64      `json:"requests_per_unit"`
	Unit            rules.Unit `json:"unit"`
	// Multiplier is unit_multiplier: the window is that many units; 0 is 1.
	Multiplier uint32 `json:"unit_multiplier,omitempty"`
}

// Request is a rate limit check, the JSON mapping of Envoy's RateLimitRequest.
type Request struct {
	Domain      string       `json:"domain"`
	Descriptors []Descriptor `json:"descriptors"`
	// HitsAddend is how many hits the request counts; 0 means 1, as in Envoy.
	HitsAddend int64 `json:"hits_addend"`
}

// hits returns how many hits descriptor d counts in a request whose
// hits_addend is reqHits: its own HitsAddend when set, else reqHits, 0 as 1.
func (d *Descriptor) hits(reqHits int64) int64 {
	if d.HitsAddend != nil {
		return *d.HitsAddend
	}
	return max(reqHits, 1)
}

// RequestError reports a malformed request. Field names the offending part in
// the JSON's terms, e.g. "descriptors[2].entries[0].value".
type RequestError struct {
	Field, Msg string
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Msg }

// Validate checks the request against the bounds above.
func (r *Request) Validate() error {
	switch {
	case r.Domain == "":
		return &RequestError{"domain", "is required"}
	case len(r.Domain) > MaxDomainBytes:
		return &RequestError{"domain", fmt.Sprintf("is %d bytes, the limit is %d", len(r.Domain), MaxDomainBytes)}
	case len(r.Descriptors) == 0:
		return &RequestError{"descriptors", "at least one descriptor is required"}
	case len(r.Descriptors) > MaxDescriptors:
		return &RequestError{"descriptors", fmt.Sprintf("%d descriptors, the limit is %d", len(r.Descriptors), MaxDescriptors)}
	case r.HitsAddend < 0 || r.HitsAddend > MaxHits:
		return &RequestError{"hits_addend", fmt.Sprintf("must be between 0 and %d, got %d", MaxHits, r.HitsAddend)}
	}
	for i, d := range r.Descriptors {
		// A descriptor without entries matches nothing and is answered OK,
		// as Envoy's ratelimit answers it.
		if len(d.Entries) > MaxEntries {
			return &RequestError{fmt.Sprintf("descriptors[%d].entries", i), fmt.Sprintf("%d entries, the limit is %d", len(d.Entries), MaxEntries)}
		}
		for j, e := range d.Entries {
			switch {
			case e.Key == "":
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), "is required"}
			case len(e.Key) > MaxKeyBytes:
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), fmt.Sprintf("is %d bytes, the limit is %d", len(e.Key), MaxKeyBytes)}
			case len(e.Value) > MaxValueBytes:
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), fmt.Sprintf("is %d bytes, the limit is %d", len(e.Value), MaxValueBytes)}
			}
		}
		if h := d.HitsAddend; h != nil && (*h < 0 || *h > MaxHits) {
			return &RequestError{fmt.Sprintf("descriptors[%d].hits_addend", i), fmt.Sprintf("must be between 0 and %d, got %d", MaxHits, *h)}
		}
		if o := d.Limit; o != nil {
			if o.RequestsPerUnit < 0 || o.RequestsPerUnit > math.MaxUint32 {
				return &RequestError{fmt.Sprintf("descriptors[%d].limit.requests_per_unit", i), fmt.Sprintf("must be between 0 and %d, got %d", uint32(math.MaxUint32), o.RequestsPerUnit)}
			}
			if o.Unit.Duration() <= 0 {
				return &RequestError{fmt.Sprintf("descriptors[%d].limit.unit", i), fmt.Sprintf("unknown unit %d", o.Unit)}
			}
			if o.Multiplier > 1 && time.Duration(o.Multiplier) > rules.MaxWindow/o.Unit.Duration() {
				return &RequestError{fmt.Sprintf("descriptors[%d].limit.unit_multiplier", i), fmt.Sprintf("must be at most %d for unit %s (a window of at most %v), got %d", int64(rules.MaxWindow/o.Unit.Duration()), o.Unit, rules.MaxWindow, o.Multiplier)}
			}
		}
	}
	return nil
}

// Code is a check's outcome.
type Code uint8

const (
	OK Code = iota
	OverLimit
)

func (c Code) String() string {
	if c == OverLimit {
		return "OVER_LIMIT"
	}
	return "OK"
}

// Status is the outcome for one descriptor.
type Status struct {
	Code Code
	// Limit is the limit that decided the descriptor: the denying one with the
	// longest wait, else the enforced one with the least room left. Nil when
	// the descriptor matched no limit or an unlimited one.
	Limit *rules.Limit
	// Remaining is how many more hits the limit allows now.
	Remaining int64
	// Reset is the time until the limit's window ends (or its bucket is full).
	Reset time.Duration
	// RetryAfter is, when denied, the time until the same hits would fit.
	RetryAfter time.Duration
	// Unlimited is set when the descriptor matched an unlimited limit and no
	// other; Limit is then nil. Envoy's ratelimit reports such a descriptor
	// with limit_remaining 4294967295.
	Unlimited bool
	// Shadow is set when Limit is a shadow_mode limit, reported as Envoy's
	// ratelimit reports one (its limit and remaining, code OK) because the
	// descriptor matched no enforced limit. Headers never report it.
	Shadow bool
}

// Result is the outcome of a check. Reuse one across calls to avoid allocation.
type Result struct {
	Code     Code
	Statuses []Status
	// Decisive indexes the status that response headers report: the denial with
	// the longest RetryAfter, else the status with the least room left; -1
	// when no enforced limit matched.
	Decisive int
	// Policies are the enforced limits the request matched, for RateLimit-Policy.
	Policies []*rules.Limit
	// Lease, when the request was admitted holding concurrency slots
	// (CheckLeaseAt), is the token that releases them; else "".
	Lease string
	// await, for a request only bounded limits denied while allowance for
	// them may be on its way, is closed when deciding it again may admit
	// it (UseAllowanceWait); else nil.
	await <-chan struct{}
}

// Engine decides checks: it matches a request's descriptors to limits in the
// current rule set, and asks the store, in one atomic call, whether every
// limit allows the hits. The most restrictive limit decides: a generous limit
// never lets a request past a strict one.
//
// What a denial costs: a denied request consumes no quota at all — not of the
// limit that denied it, nor of the other limits it matched (they report the
// room they had). The request was not served, so no quota pays for it, and a
// client that retries too early does not push its own Retry-After further out.
// A shadow limit (shadow_mode) is counted and reported in metrics, never denies,
// and stops counting at its limit.
//
// An Engine is safe for concurrent use. SetRules swaps rule sets atomically;
// a check sees one rule set throughout.
type Engine struct {
	store   Store
	leases  Leaser // nil: concurrency limits are not applied (UseLeases)
	rules   atomic.Pointer[rules.Set]
	metrics *Metrics
	mit     *Mitigations    // nil: no mitigation bits
	quotas  Quotas          // nil: no per-key quotas (tenants.go)
	top     *topkeys.Sketch // nil: no top limited keys
	share   atomic.Uint64   // math.Float64bits of the global share; 0 bits = 1.0
	// countDenied: pop-scope limits count denied hits (SetCountDenied).
	countDenied atomic.Bool
	// shadow answers OK what a limit denies (SetShadowMode); quotaAll
	// holds every descriptor to its quotas (SetQuotaMode).
	shadow, quotaAll atomic.Bool
	// overrideAlg counts a request's own limit on a descriptor that matched
	// none (SetOverrideAlgorithm).
	overrideAlg atomic.Uint32
	clock       atomic.Int64 // correction of the wall clock, ns (SetClockOffset)
	scratch     sync.Pool
	// waiter and awaitMax: how a request bounded limits denied waits for
	// allowance (UseAllowanceWait); nil or 0: it does not.
	waiter   AllowanceWaiter
	awaitMax time.Duration
}

// DefaultBoundedWait is how long edgelimit pop (--bounded-wait) and the
// simulator let a check wait for bounded allowance (UseAllowanceWait). A
// give reaches this PoP after its demand has reached the giver and the
// give has come back — a round trip between regions, up to about 300 ms
// between the farthest continents — plus two urgent publications (10 ms
// each): a wait of this length lets most gives arrive, and bounds what a
// denied client waits.
const DefaultBoundedWait = 250 * time.Millisecond

// AllowanceWaiter is the store's side of waiting for bounded allowance
// (store.Memory.AwaitAllowance): for a check of hits that the bounded item
// it denied at now, a channel closed once deciding it again may admit it,
// or nil when no allowance for it is on its way.
type AllowanceWaiter interface {
	AwaitAllowance(it *limit.Item, now, hits int64) <-chan struct{}
}

// UseAllowanceWait makes a request that only bounded limits deny wait up
// to max for allowance another PoP is about to give this one, and be
// decided again when it arrives: a bounded limit starts each PoP with a
// share of the limit and moves unused allowance to where the demand is,
// which takes about a round trip between PoPs, and a client faster than
// that would be denied meanwhile while within its limit. The wait happens
// only while w says a give may come (another PoP holds allowance it does not
// need); a client over its limit is denied at once. Only a request whose
// denial spent nothing waits (see deniedSpentNothing), and only its final
// decision is reported in the metrics. Call it before serving. The
// simulator's checks wait on its own clock (DecideAt).
func (e *Engine) UseAllowanceWait(w AllowanceWaiter, max time.Duration) {
	e.waiter, e.awaitMax = w, max
}

// SetClockOffset makes Check decide at the wall clock plus d: the correction
// replication agrees on with the other PoPs, so that every PoP starts a
// window at the same instant (replication/core/clock.go).
func (e *Engine) SetClockOffset(d time.Duration) { e.clock.Store(int64(d)) }

// Now returns the time Check decides at: the wall clock plus the offset set
// by SetClockOffset.
func (e *Engine) Now() time.Time { return time.Now().Add(time.Duration(e.clock.Load())) }

// SetGlobalShare scales every global-scope limit by share (0 < share ≤ 1):
// while this PoP's region is cut off from others, it enforces only its part
// of a global limit, so that no side of a partition can spend the whole
// budget alone. 1 restores the full limits.
func (e *Engine) SetGlobalShare(share float64) {
	if share <= 0 || share >= 1 {
		e.share.Store(0)
		return
	}
	e.share.Store(math.Float64bits(share))
}

// GlobalShare returns the share set by SetGlobalShare (1 when none).
func (e *Engine) GlobalShare() float64 {
	if b := e.share.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// UseMitigations makes the engine consult and issue mitigation bits in m:
// a region or global limit whose key carries a bit denies at once, without
// the store, until the bit ends; and a check that finds a key over such a
// limit issues a bit (until the sliding estimate falls back under the limit,
// or for the rule's mitigation duration). Call it before serving.
func (e *Engine) UseMitigations(m *Mitigations) { e.mit = m }

// UseTopKeys makes the engine count every key a limit denies, or a
// mitigation bit denies, in top (a fixed-memory sketch of the most limited
// keys). Call it before serving.
func (e *Engine) UseTopKeys(top *topkeys.Sketch) { e.top = top }

// NewEngine returns an engine deciding against store with the given rules.
// metrics may be nil.
func NewEngine(store Store, set *rules.Set, metrics *Metrics) *Engine {
	e := &Engine{store: store, metrics: metrics}
	e.scratch.New = func() any { return new(scratch) }
	e.SetRules(set)
	return e
}

// SetRules makes set the rule set of every check that starts from now on.
func (e *Engine) SetRules(set *rules.Set) {
	if set == nil {
		set, _ = rules.NewSet()
	}
	e.metrics.RulesLoaded(set)
	e.rules.Store(set)
}

// Rules returns the rule set in force.
func (e *Engine) Rules() *rules.Set { return e.rules.Load() }

// scratch is a check's working memory, pooled so that a check does not allocate.
type scratch struct {
	keys    []byte
	ends    []int // keys[ends[i-1]:ends[i]] is item i's key
	items   []limit.Item
	out     []limit.Decision
	limits  []*rules.Limit
	owner   []int // descriptor index of each item
	matched []int // descriptor index → first item, for statuses
	// hits is what each item counts; 0 for an item only peeked at (see
	// decide). override marks the items of a request's own limit.
	hits     []int64
	override []bool
	// group* hold one hits group's items for the store (decideGroups).
	groupIdx   []int
	groupItems []limit.Item
	groupOut   []limit.Decision
	decided    []bool
	replaced   []*rules.Limit // see Engine.replaced
	// dups are the occurrences of the keys the request names more than
	// once (see repeat); empty for nearly every request. recount holds
	// the items whose denied hits are counted after the decision (see
	// countRepeated).
	dups    []occurrence
	recount []int
	// quotaPass: a descriptor that matched no limit holds the request
	// within its quotas (SetQuotaMode).
	quotaPass bool
	// slot* hold the request's concurrency limits (concurrency.go).
	slots        []limit.SlotItem
	slotOut      []limit.SlotDecision
	slotLimits   []*rules.Limit
	slotOwner    []int
	slotKey      []byte
	leaseID      limit.LeaseID
	leaseKeys    []limit.SlotKey
	leased       bool // the slots are held
	slotsDecided bool // slotOut holds decisions
}

// Check decides req at the wall-clock time. See CheckAt.
func (e *Engine) Check(ctx context.Context, req *Request, res *Result) error {
	return e.CheckAt(ctx, e.Now(), req, res)
}

// CheckAt decides req at now and writes the outcome to res. It returns a
// *RequestError for a malformed request and the store's error when the store
// could not decide; then res is not valid. Concurrency limits are left out
// (see CheckLeaseAt).
func (e *Engine) CheckAt(ctx context.Context, now time.Time, req *Request, res *Result) error {
	return e.check(ctx, now, req, res, false)
}

// check is CheckAt, with the request's concurrency limits when leases.
func (e *Engine) check(ctx context.Context, now time.Time, req *Request, res *Result, leases bool) error {
	wait := e.waitBudget(ctx)
	err := e.decideRequest(ctx, now, req, res, leases, wait > 0, false)
	if err == nil && res.await != nil {
		err = e.awaitAllowance(ctx, now, wait, req, res, leases)
	}
	if err == nil && res.Code == OverLimit && e.shadow.Load() {
		e.shadowAnswer(res)
	}
	return err
}

// DecideAt is CheckAt for a caller that waits for bounded allowance on a
// clock of its own, as the simulator does: it never blocks. With mayWait and
// UseAllowanceWait's store, a request that waiting may admit comes back
// denied with a channel that is closed once deciding it again may admit it,
// and its denial is not reported in the metrics: decide it again, with
// again set, when the channel is closed, and without mayWait at the
// caller's deadline, which reports it. Otherwise the channel is nil and res
// is final, as CheckAt's.
func (e *Engine) DecideAt(ctx context.Context, now time.Time, req *Request, res *Result, mayWait, again bool) (<-chan struct{}, error) {
	err := e.decideRequest(ctx, now, req, res, false, mayWait, again)
	if err == nil && res.await == nil && res.Code == OverLimit && e.shadow.Load() {
		e.shadowAnswer(res)
	}
	return res.await, err
}

// waitBudget is how long a check under ctx may wait for bounded allowance:
// UseAllowanceWait's max, but no closer to ctx's deadline than a quarter of
// the time left, and at least answerMargin. A client that stops waiting
// first — Envoy's rate limit filter gives up after 20 ms by default and,
// failing open, lets the request through — would take an admission past a
// bounded limit for a check this PoP then denies; so the wait ends while
// the answer can still reach it.
func (e *Engine) waitBudget(ctx context.Context) time.Duration {
	wait := e.awaitMax
	if dl, ok := ctx.Deadline(); ok && wait > 0 {
		left := time.Until(dl)
		wait = min(wait, left-max(left/4, answerMargin))
	}
	return max(wait, 0)
}

// answerMargin is the least time waitBudget leaves a check to answer in
// before its deadline.
const answerMargin = 2 * time.Millisecond

// awaitAllowance decides req again each time res.await says allowance
// may have arrived, until it is admitted, nothing more is on its way, or
// wait has passed since now, when it decides it a last time. The retries
// decide at now plus the time waited.
func (e *Engine) awaitAllowance(ctx context.Context, now time.Time, wait time.Duration, req *Request, res *Result, leases bool) error {
	begun := time.Now()
	e.metrics.waitBegins()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for res.await != nil {
		last := false
		select {
		case <-res.await:
		case <-timer.C:
			last = true
		case <-ctx.Done():
			last = true
		}
		if err := e.decideRequest(ctx, now.Add(time.Since(begun)), req, res, leases, !last, true); err != nil {
			e.metrics.allowanceWait(time.Since(begun), false)
			return err
		}
	}
	e.metrics.allowanceWait(time.Since(begun), res.Code == OK)
	return nil
}

// decideRequest is check before shadow mode. With mayWait, a request only
// bounded limits deny, while allowance for them may be on its way, gets
// res.await and is not reported in the metrics: awaitAllowance decides it
// again, with again set (limit.Item.Again).
func (e *Engine) decideRequest(ctx context.Context, now time.Time, req *Request, res *Result, leases, mayWait, again bool) error {
	res.await = nil
	if err := req.Validate(); err != nil {
		return err
	}
	set := e.rules.Load()
	dom := set.Domain(req.Domain)

	res.Code, res.Decisive = OK, -1
	res.Statuses = res.Statuses[:0]
	res.Policies = res.Policies[:0]
	res.Lease = ""
	for range req.Descriptors {
		res.Statuses = append(res.Statuses, Status{})
	}
	if dom == nil {
		e.metrics.unknownDomain()
		return nil
	}

	s := e.scratch.Get().(*scratch)
	defer e.scratch.Put(s)
	s.keys, s.ends, s.items, s.limits, s.owner = s.keys[:0], s.ends[:0], s.items[:0], s.limits[:0], s.owner[:0]
	s.hits, s.override = s.hits[:0], s.override[:0]
	s.dups, s.recount = s.dups[:0], s.recount[:0]
	s.quotaPass = false
	replaced := e.replaced(dom, req, s)
	s.slots, s.slotLimits, s.slotOwner = s.slots[:0], s.slotLimits[:0], s.slotOwner[:0]

	nowNs := now.UnixNano()
	for di := range req.Descriptors {
		d := &req.Descriptors[di]
		entries := d.Entries
		matched := dom.Match(entries)
		q, tier, tenant := e.tenant(dom, entries, nowNs)
		mq := q // the key's overrides of the matched limits
		if d.Limit != nil && len(entries) > 0 {
			l, err := overrideLimit(dom, matched, d.Limit, di, limit.Algorithm(e.overrideAlg.Load()))
			if err != nil {
				return err
			}
			matched, mq = []*rules.Limit{l}, nil // the request's own limit stands
		}
		hits := d.hits(req.HitsAddend)
		for _, l := range matched {
			if l.Unlimited {
				res.Statuses[di].Unlimited = true
				continue
			}
			if len(replaced) > 0 && d.Limit == nil && slices.Contains(replaced, l) {
				continue
			}
			if l.Concurrent() {
				if leases && hits > 0 {
					s.addSlot(l, entries, di)
					res.Policies = append(res.Policies, l)
				}
				continue
			}
			l = mq.Limit(l)
			start := len(s.keys)
			s.keys = l.AppendKey(s.keys, entries)
			s.push(res, start, l, di, hits, d.Limit != nil, true)
		}
		for _, l := range tier {
			l = q.Limit(l)
			start := len(s.keys)
			s.keys = l.AppendTenantKey(s.keys, dom.Tenants.Key, tenant)
			s.push(res, start, l, di, hits, false, false)
		}
	}
	n := len(s.limits)
	if n == 0 && len(s.slots) == 0 {
		return nil
	}
	share := e.share.Load()
	countDenied := e.countDenied.Load()
	quotaMode := false
	for i, l := range s.limits {
		s.items = append(s.items, itemFor(l, s.key(i), share, countDenied))
		s.items[len(s.items)-1].Again = again
		quotaMode = quotaMode || l.QuotaMode
	}
	if len(s.dups) > 0 {
		s.liftCountDenied()
	}
	if cap(s.out) < n {
		s.out = make([]limit.Decision, n)
	}
	s.out = s.out[:n]

	if e.mit != nil {
		for i := range s.items {
			it := &s.items[i]
			if it.Scope == limit.ScopePOP || it.Shadow {
				continue
			}
			if until, ok := e.mit.Until(it.Key, nowNs); ok {
				if e.top != nil {
					e.top.Add(it.Key, 1)
				}
				e.mitigated(res, s.limits[i], s.owner[i], time.Duration(until-nowNs))
				return nil
			}
		}
	}
	slotsOK := e.acquire(ctx, s, nowNs)
	if !slotsOK {
		clear(s.hits) // no slot: the rate limits are only peeked at
	}
	admitted := true
	var err error
	switch {
	case n == 0:
	case quotaMode:
		if e.quotaAll.Load() {
			s.quotaPass = s.unmatched(res)
		}
		admitted, err = e.decideQuotaMode(ctx, s, nowNs)
	default:
		admitted, err = e.decide(ctx, s, nowNs)
	}
	if err != nil {
		e.settleSlots(ctx, s, res, false, nowNs) // gives back the slots
		res.Lease = ""
		if !errors.Is(err, context.Canceled) || ctx.Err() == nil { // a caller that left is no store error
			e.metrics.storeError()
		}
		return fmt.Errorf("pop: store: %w", err)
	}
	admitted = admitted && slotsOK
	if len(s.recount) > 0 {
		e.countRepeated(ctx, s, nowNs, admitted)
	}
	e.settleSlots(ctx, s, res, admitted, nowNs)
	if !admitted {
		res.Code = OverLimit
		if mayWait && e.waiter != nil && slotsOK && !quotaMode && s.deniedSpentNothing() {
			res.await = e.awaitFor(s, nowNs)
		}
		// No bits while the region is cut off: a key over its reduced share
		// is not over the limit once the link heals, and a bit would outlive
		// the partition everywhere it travels.
		if e.mit != nil && share == 0 {
			e.issue(s, nowNs)
		}
	}
	final := res.await == nil // a request that waits is decided again, and reported then
	for i, l := range s.limits {
		d := s.out[i]
		if !d.Allowed && !l.Shadow && e.top != nil && final {
			e.top.Add(s.key(i), 1)
		}
		if len(s.dups) == 0 || !s.repeated(i) {
			e.report(&res.Statuses[s.owner[i]], l, d, final && s.hits[i] > 0, admitted)
			continue
		}
		for _, o := range s.dups {
			if o.item == i {
				e.report(&res.Statuses[o.di], l, s.occurrenceDecision(i, o, admitted), final && o.hits > 0 && s.hits[i] > 0, admitted)
			}
		}
	}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Limit == nil || st.Shadow {
			continue
		}
		if res.Decisive < 0 || statusMorePressing(st, &res.Statuses[res.Decisive]) {
			res.Decisive = i
		}
	}
	return nil
}

// deniedSpentNothing reports whether a denied request spent nothing, so
// that deciding it again counts nothing twice: its items were decided in
// one store step (the same hits for each), none counts denied hits, none
// is strong (its home decided on its own counter), and no repeated key was
// counted after the denial (countRepeated). Only such a request waits for
// bounded allowance.
func (s *scratch) deniedSpentNothing() bool {
	if len(s.recount) > 0 {
		return false
	}
	for i := range s.items {
		it := &s.items[i]
		if s.hits[i] != s.hits[0] || it.CountsDenied() || it.Consistency == limit.Strong && it.Scope != limit.ScopePOP {
			return false
		}
	}
	return true
}

// awaitFor is the channel a denied request waits on for bounded allowance
// (UseAllowanceWait), or nil when waiting brings nothing: when a limit that
// is not bounded denied it too, or a bounded one that denied it has no
// allowance on its way.
func (e *Engine) awaitFor(s *scratch, nowNs int64) <-chan struct{} {
	var ch <-chan struct{}
	for i := range s.items {
		it := &s.items[i]
		if s.out[i].Allowed || it.Shadow {
			continue
		}
		if it.Consistency != limit.Bounded || s.hits[i] <= 0 {
			return nil
		}
		c := e.waiter.AwaitAllowance(it, nowNs, s.hits[i])
		if c == nil {
			return nil
		}
		if ch == nil {
			ch = c
		}
	}
	return ch
}

// report makes decision d of limit l part of st, its descriptor's status, and
// counts it in the metrics when it counted hits.
func (e *Engine) report(st *Status, l *rules.Limit, d limit.Decision, counted, admitted bool) {
	if counted { // a check that counts nothing is no decision
		e.metrics.decision(l, d.Allowed, admitted)
	}
	if l.Shadow {
		// Reported only while no enforced limit is (see Status.Shadow).
		if st.Limit == nil || st.Shadow && d.Remaining < st.Remaining {
			*st = Status{Limit: l, Remaining: d.Remaining, Reset: time.Duration(d.Reset), Shadow: true}
		}
		return
	}
	if st.Shadow || morePressing(d, st) {
		*st = Status{Limit: l, Remaining: d.Remaining, Reset: time.Duration(d.Reset), RetryAfter: time.Duration(d.RetryAfter)}
		if !d.Allowed {
			st.Code = OverLimit
		}
	}
}

// decide asks the store about s.items and writes s.out; it reports whether
// the request is admitted. When every item counts the same hits — the common
// case — that is one atomic store step, and a denied request spends nothing.
// Otherwise see decideGroups.
func (e *Engine) decide(ctx context.Context, s *scratch, nowNs int64) (bool, error) {
	first := s.hits[0]
	uniform := first > 0
	for _, h := range s.hits[1:] {
		uniform = uniform && h == first
	}
	if !uniform {
		if len(s.dups) > 0 {
			return e.decideRepeated(ctx, s, nowNs)
		}
		return e.decideGroups(ctx, s, nowNs)
	}
	if err := e.store.CheckAt(ctx, nowNs, first, s.items, s.out); err != nil {
		return false, err
	}
	return limit.Admit(s.items, s.out), nil
}

// decideGroups decides items that count different hits (Envoy's
// per-descriptor hits_addend): each group of items with the same hits is one
// atomic store step. Items counting 0 hits go first and are only peeked at
// (see peek); once a group denies the request, the groups after it are only
// peeked at too, so they spend nothing — but a group decided before the
// denial has spent its hits, as every descriptor does in Envoy's ratelimit,
// and so do the items after it that count denied hits (spendDenied).
// The hits of peeked items become 0 in s.hits, but those of repeated keys
// that count denied hits after the denial: countRepeated counts them.
func (e *Engine) decideGroups(ctx context.Context, s *scratch, nowNs int64) (bool, error) {
	return e.decideGroupsFrom(ctx, s, nowNs, 0)
}

// decideGroupsFrom is decideGroups deciding the items that count first hits
// before the others that count hits, when first is above 0 (decideRepeated).
func (e *Engine) decideGroupsFrom(ctx context.Context, s *scratch, nowNs int64, first int64) (bool, error) {
	admitted := true
	s.decided = append(s.decided[:0], make([]bool, len(s.items))...)
	done := 0 // items decided so far
	for pass := 0; done < len(s.items); pass++ {
		// Pass 0 takes the 0-hit items, each later pass the hits of the
		// first item not yet decided.
		h := int64(0)
		if pass == 1 && first > 0 {
			h = first
		} else if pass > 0 {
			for i, o := range s.hits {
				if o > 0 && !s.decided[i] {
					h = o
					break
				}
			}
		}
		s.groupIdx, s.groupItems = s.groupIdx[:0], s.groupItems[:0]
		for i := range s.items {
			if s.hits[i] == h && !s.decided[i] {
				s.groupIdx = append(s.groupIdx, i)
				s.groupItems = append(s.groupItems, s.items[i])
			}
		}
		if len(s.groupIdx) == 0 {
			continue
		}
		peeking := h == 0 || !admitted
		hits := h
		if h > 0 && !admitted {
			n, err := e.spendDenied(ctx, s, nowNs, h)
			if err != nil {
				return false, err
			}
			done += n
			if len(s.groupIdx) == 0 {
				continue
			}
		}
		if peeking {
			hits = peekHits(s.groupItems)
			for j := range s.groupItems {
				s.groupItems[j].CountDenied = false // a peek counts nothing
			}
		}
		s.groupOut = append(s.groupOut[:0], make([]limit.Decision, len(s.groupIdx))...)
		if err := e.store.CheckAt(ctx, nowNs, hits, s.groupItems, s.groupOut); err != nil {
			return false, err
		}
		for j, i := range s.groupIdx {
			d := s.groupOut[j]
			if peeking {
				d = peek(d)
				if h == 0 || !slices.Contains(s.recount, i) { // countRepeated counts those
					s.hits[i] = 0
				}
			}
			s.out[i], s.decided[i] = d, true
			if !d.Allowed && !s.items[i].Shadow {
				admitted = false
			}
		}
		done += len(s.groupIdx)
	}
	return admitted, nil
}

// peekHits is a number of hits none of items can ever admit. Stores spend
// nothing on a denied request (limit.Decide), so checking that many hits is a
// read: the decisions say how much room each limit has, and count nothing.
func peekHits(items []limit.Item) int64 {
	var most int64
	for i := range items {
		most = max(most, items[i].Spec.Limit, items[i].Spec.Capacity())
	}
	return most + 1
}

// peek turns the decision on peekHits into the answer of a check that counts
// nothing: allowed when one more hit fits. RetryAfter of a peek that finds
// no room is the time until the limit resets, an upper bound.
func peek(d limit.Decision) limit.Decision {
	p := limit.Decision{Allowed: d.Remaining > 0, Remaining: d.Remaining, Reset: d.Reset}
	if !p.Allowed {
		p.RetryAfter = max(d.Reset, 1)
	}
	return p
}

// mitigated writes the answer for a request denied by a mitigation bit on
// limit l of descriptor di, without asking the store.
func (e *Engine) mitigated(res *Result, l *rules.Limit, di int, wait time.Duration) {
	res.Code, res.Decisive = OverLimit, di
	res.Statuses[di] = Status{Code: OverLimit, Limit: l, Reset: wait, RetryAfter: wait}
	e.metrics.mitigatedDecision(l)
}

// issue records a mitigation bit for every region or global limit that a
// single hit found over: with no room left, the key is over for any request
// until RetryAfter (the time the sliding estimate falls back under the limit),
// or for the rule's mitigation duration. A request for several hits can be
// denied while one would fit, so only single hits issue bits; a request's own
// limit (Override) issues none, nor does a bounded limit: its denial says
// this PoP's allowance is spent, not that the key is over everywhere; nor a
// strong one: its home decides every check anyway, and a denial made without
// the home (fail_closed, or the share while it is unreachable) says nothing
// of the key elsewhere.
func (e *Engine) issue(s *scratch, nowNs int64) {
	for i, l := range s.limits {
		d := s.out[i]
		if d.Allowed || l.Shadow || l.QuotaMode || l.Scope == limit.ScopePOP || l.Consistency != limit.Eventual || d.Remaining != 0 || s.hits[i] != 1 || s.override[i] {
			continue
		}
		until := nowNs + d.RetryAfter
		if l.Mitigation > 0 {
			until = nowNs + int64(l.Mitigation)
		}
		e.mit.Issue(s.items[i].Key, l.Scope, until, nowNs)
	}
}

// push adds limit l of descriptor di, whose key is s.keys[start:], to the
// check — unless the same key is already there. A key that another
// descriptor named already is charged again when repeat is set (a repeated
// descriptor: see repeat); else (a tier reached from two descriptors) the
// request counts on it once.
func (s *scratch) push(res *Result, start int, l *rules.Limit, di int, hits int64, override, repeat bool) {
	for i := range s.ends {
		if bytes.Equal(s.key(i), s.keys[start:]) {
			s.keys = s.keys[:start]
			if repeat {
				s.repeat(i, di, hits)
			}
			return
		}
	}
	s.ends = append(s.ends, len(s.keys))
	s.limits = append(s.limits, l)
	s.owner = append(s.owner, di)
	s.hits = append(s.hits, hits)
	s.override = append(s.override, override)
	if !l.Shadow {
		res.Policies = append(res.Policies, l)
	}
}

// occurrence is one of the occurrences of a key that a request names more
// than once: the item that counts the key, the descriptor, its hits, and
// cum, the hits of the key's occurrences up to and including this one.
type occurrence struct {
	item, di  int
	hits, cum int64
}

// repeat charges item i again for descriptor di, which named its key once
// more. Envoy sends the same descriptor twice when two rate limit actions
// produce it, and Envoy's ratelimit charges each occurrence, in order (one
// INCRBY each): the second sees the first's hits. A store step cannot hold a
// key twice, so the item counts the hits of every occurrence, and the
// occurrences, kept in s.dups, get their statuses from its decision
// (occurrenceDecision). Another limit of the same descriptor that names the
// key is no new occurrence.
func (s *scratch) repeat(i, di int, hits int64) {
	last, seen := s.owner[i], false
	for _, o := range s.dups {
		if o.item == i {
			last, seen = o.di, true
		}
	}
	if last == di {
		return
	}
	if !seen {
		s.dups = append(s.dups, occurrence{item: i, di: s.owner[i], hits: s.hits[i], cum: s.hits[i]})
	}
	s.hits[i] += hits
	s.dups = append(s.dups, occurrence{item: i, di: di, hits: hits, cum: s.hits[i]})
}

// repeated reports whether item i counts a key the request names more than once.
func (s *scratch) repeated(i int) bool {
	for _, o := range s.dups {
		if o.item == i {
			return true
		}
	}
	return false
}

// occurrenceDecision is the decision for occurrence o of item i's key, from
// the item's decision on the hits of all its occurrences, as Envoy's
// ratelimit answers each: it fits when the hits of this occurrence and of
// those before it do. When the request was admitted, its remaining is the
// room after them (the first occurrence's after its own hits, the second's
// after both); when the item's hits were counted though the request was
// denied (countRepeated), the same, and none for an occurrence that did not
// fit. Otherwise nothing was spent, and every occurrence reports the room the
// key had, as any limit of a denied request does. An occurrence that does not
// fit waits as long as the item: until the request's hits fit.
func (s *scratch) occurrenceDecision(i int, o occurrence, admitted bool) limit.Decision {
	d := s.out[i]
	total := int64(0)
	for _, p := range s.dups {
		if p.item == i {
			total = p.cum
		}
	}
	spent := admitted && d.Allowed && s.hits[i] > 0
	room := d.Remaining // the room before the request
	if spent {
		room += total
	}
	if !spent && s.hits[i] > 0 && slices.Contains(s.recount, i) {
		spent = true // counted after the decision (countRepeated)
	}
	fits := o.cum <= room
	if o.hits == 0 {
		fits = o.cum < room // a check that counts nothing: one more hit fits
	}
	od := limit.Decision{Allowed: fits, Remaining: room, Reset: d.Reset}
	switch {
	case !fits:
		od.RetryAfter = max(d.RetryAfter, 1)
		if spent {
			od.Remaining = 0
		}
	case spent:
		od.Remaining = room - o.cum
	}
	return od
}

// liftCountDenied takes CountDenied off the items of repeated keys, so that
// the decision says how much room such a key had even when it denies (a
// denied CountDenied item reports none: its hits are spent), and puts them
// in s.recount: countRepeated counts their hits when the request is denied,
// or when a shadow one denies them. Sliding_log items, which never count
// denied hits (limit.Item.CountsDenied), keep it.
func (s *scratch) liftCountDenied() {
	for _, o := range s.dups {
		if it := &s.items[o.item]; it.CountsDenied() {
			it.CountDenied = false
			s.recount = append(s.recount, o.item)
		}
	}
}

// countRepeated counts the hits of a denied request on the items of repeated
// keys that count denied hits (liftCountDenied), as their CountDenied would
// have: the store adds hits that do not fit to such an item too. Of an
// admitted request, it counts those of the shadow items among them that
// denied the hits (the others that allowed them counted them). Items only
// peeked at count nothing, as in decideGroups. The request is decided: a
// store error here is counted, and changes no answer.
func (e *Engine) countRepeated(ctx context.Context, s *scratch, nowNs int64, admitted bool) {
	for _, i := range s.recount {
		if s.hits[i] == 0 || admitted && s.out[i].Allowed {
			continue
		}
		s.groupItems = append(s.groupItems[:0], s.items[i])
		s.groupItems[0].CountDenied = true
		s.groupOut = append(s.groupOut[:0], limit.Decision{})
		if err := e.store.CheckAt(ctx, nowNs, s.hits[i], s.groupItems, s.groupOut); err != nil {
			e.metrics.storeError()
		}
	}
}

// decideRepeated is decide for a request whose repeated keys make its items
// count different hits, though its descriptors may count the same (three
// occurrences of one key and one of another: 3 and 1). One store step counts
// one number of hits, so the items are decided in groups of equal hits
// (decideGroups), where a group decided before a later one denies would have
// spent its hits. So all of them are peeked at first, in one step: when one
// would deny, its group is decided first, and the request is denied before
// anything is spent. Only a concurrent request that takes the room between
// the peek and the groups can leave an earlier group spent.
func (e *Engine) decideRepeated(ctx context.Context, s *scratch, nowNs int64) (bool, error) {
	s.groupIdx, s.groupItems = s.groupIdx[:0], s.groupItems[:0]
	for i := range s.items {
		if s.hits[i] > 0 {
			s.groupIdx = append(s.groupIdx, i)
			s.groupItems = append(s.groupItems, s.items[i])
			s.groupItems[len(s.groupItems)-1].CountDenied = false // a peek counts nothing
		}
	}
	if len(s.groupIdx) == 0 { // every item only peeked at
		return e.decideGroups(ctx, s, nowNs)
	}
	s.groupOut = append(s.groupOut[:0], make([]limit.Decision, len(s.groupIdx))...)
	if err := e.store.CheckAt(ctx, nowNs, peekHits(s.groupItems), s.groupItems, s.groupOut); err != nil {
		return false, err
	}
	first := int64(0)
	for j, i := range s.groupIdx {
		if s.groupOut[j].Remaining < s.hits[i] && !s.items[i].Shadow {
			first = s.hits[i]
			break
		}
	}
	return e.decideGroupsFrom(ctx, s, nowNs, first)
}

// itemFor is the store item of limit l under key: while the region is cut
// off (share, math.Float64bits of the global share; 0 for none), a global
// limit shrinks to its share; a quota-mode limit never denies on its own
// (decideQuotaMode); with countDenied, pop-scope limits count denied hits.
func itemFor(l *rules.Limit, key []byte, share uint64, countDenied bool) limit.Item {
	it := limit.Item{Key: key, Spec: l.Spec, Shadow: l.Shadow || l.QuotaMode, FailClosed: l.FailClosed, Scope: l.Scope,
		CountDenied: countDenied && l.Scope == limit.ScopePOP, Consistency: l.Consistency}
	// A bounded limit holds while its region is cut off without shrinking:
	// the allowances this PoP holds are all it can admit.
	if share != 0 && l.Scope == limit.ScopeGlobal && l.Consistency != limit.Bounded {
		it.Spec.Limit = int64(float64(it.Spec.Limit) * math.Float64frombits(share))
		it.Shrunk, it.Unshrunk = true, l.Spec.Limit
	}
	return it
}

func (s *scratch) key(i int) []byte {
	start := 0
	if i > 0 {
		start = s.ends[i-1]
	}
	return s.keys[start:s.ends[i]]
}

// morePressing reports whether decision d should replace st as its
// descriptor's status: a denial beats an allowance, a longer wait beats a
// shorter one, less room beats more.
func morePressing(d limit.Decision, st *Status) bool {
	if st.Limit == nil {
		return true
	}
	denied, stDenied := !d.Allowed, st.Code == OverLimit
	switch {
	case denied != stDenied:
		return denied
	case denied:
		return time.Duration(d.RetryAfter) > st.RetryAfter
	default:
		return d.Remaining < st.Remaining
	}
}

func statusMorePressing(a, b *Status) bool {
	return morePressing(limit.Decision{Allowed: a.Code == OK, Remaining: a.Remaining, RetryAfter: int64(a.RetryAfter)}, b)
}

// Describe renders a descriptor as "key:value:key:value", as 429 bodies name it.
func (d Descriptor) Describe() string {
	entries := d.Entries
	var b []byte
	for i, e := range entries {
		if i > 0 {
			b = append(b, ':')
		}
		b = append(b, e.Key...)
		b = append(b, ':')
		b = append(b, e.Value...)
	}
	return string(b)
}

// overrideLimit is the limit a request's own Override sets for descriptor di
// in domain dom, whose rule limits were matched; see Override.
func overrideLimit(dom *rules.Domain, matched []*rules.Limit, o *Override, di int, alg limit.Algorithm) (*rules.Limit, error) {
	l := &rules.Limit{Name: "override", Domain: dom.Name, Path: "override", Spec: limit.Spec{Algorithm: alg}}
	for _, m := range matched {
		if !m.Unlimited {
			*l = *m
			break
		}
	}
	l.Unit, l.Multiplier = o.Unit, o.Multiplier
	l.Spec.Limit, l.Spec.Window, l.Spec.Burst = o.RequestsPerUnit, int64(l.Window()), 0
	// As Envoy's ratelimit builds an override: never shadow or quota mode,
	// counted on the request's own values (no share_threshold pattern).
	l.Shadow, l.Unlimited, l.Mitigation, l.Replaces = false, false, 0, nil
	l.QuotaMode, l.Shared = false, nil
	if err := l.Spec.Validate(); err != nil {
		return nil, &RequestError{fmt.Sprintf("descriptors[%d].limit", di), fmt.Sprintf("does not fit the matched %s limit: %v", l.Spec.Algorithm, err)}
	}
	return l, nil
}
