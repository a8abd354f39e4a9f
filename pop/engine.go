package pop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
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

// Descriptor is one descriptor of a request: an ordered list of entries.
type Descriptor struct {
	Entries []rules.Entry `json:"entries"`
}

// Request is a rate limit check, the JSON mapping of Envoy's RateLimitRequest.
type Request struct {
	Domain      string       `json:"domain"`
	Descriptors []Descriptor `json:"descriptors"`
	// HitsAddend is how many hits the request counts; 0 means 1, as in Envoy.
	HitsAddend int64 `json:"hits_addend"`
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
		if len(d.Entries) == 0 {
			return &RequestError{fmt.Sprintf("descriptors[%d].entries", i), "at least one entry is required"}
		}
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
	rules   atomic.Pointer[rules.Set]
	metrics *Metrics
	mit     *Mitigations  // nil: no mitigation bits
	share   atomic.Uint64 // math.Float64bits of the global share; 0 bits = 1.0
	scratch sync.Pool
}

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
}

// Check decides req at the wall-clock time. See CheckAt.
func (e *Engine) Check(ctx context.Context, req *Request, res *Result) error {
	return e.CheckAt(ctx, time.Now(), req, res)
}

// CheckAt decides req at now and writes the outcome to res. It returns a
// *RequestError for a malformed request and the store's error when the store
// could not decide; then res is not valid.
func (e *Engine) CheckAt(ctx context.Context, now time.Time, req *Request, res *Result) error {
	if err := req.Validate(); err != nil {
		return err
	}
	hits := max(req.HitsAddend, 1)
	set := e.rules.Load()
	dom := set.Domain(req.Domain)

	res.Code, res.Decisive = OK, -1
	res.Statuses = res.Statuses[:0]
	res.Policies = res.Policies[:0]
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

	for di := range req.Descriptors {
		entries := req.Descriptors[di].Entries
	limits:
		for _, l := range dom.Match(entries) {
			if l.Unlimited {
				continue
			}
			start := len(s.keys)
			s.keys = l.AppendKey(s.keys, entries)
			// The same limit reached twice (a repeated descriptor) counts once.
			for i := range s.ends {
				if bytes.Equal(s.key(i), s.keys[start:]) {
					s.keys = s.keys[:start]
					continue limits
				}
			}
			s.ends = append(s.ends, len(s.keys))
			s.limits = append(s.limits, l)
			s.owner = append(s.owner, di)
			if !l.Shadow {
				res.Policies = append(res.Policies, l)
			}
		}
	}
	n := len(s.limits)
	if n == 0 {
		return nil
	}
	share := e.share.Load()
	for i, l := range s.limits {
		it := limit.Item{Key: s.key(i), Spec: l.Spec, Shadow: l.Shadow, FailClosed: l.FailClosed, Scope: l.Scope}
		if share != 0 && l.Scope == limit.ScopeGlobal {
			it.Spec.Limit = int64(float64(it.Spec.Limit) * math.Float64frombits(share))
		}
		s.items = append(s.items, it)
	}
	if cap(s.out) < n {
		s.out = make([]limit.Decision, n)
	}
	s.out = s.out[:n]

	nowNs := now.UnixNano()
	if e.mit != nil {
		for i := range s.items {
			it := &s.items[i]
			if it.Scope == limit.ScopePOP || it.Shadow {
				continue
			}
			if until, ok := e.mit.Until(it.Key, nowNs); ok {
				e.mitigated(res, s.limits[i], s.owner[i], time.Duration(until-nowNs))
				return nil
			}
		}
	}
	if err := e.store.CheckAt(ctx, nowNs, hits, s.items, s.out); err != nil {
		if !errors.Is(err, context.Canceled) || ctx.Err() == nil { // a caller that left is no store error
			e.metrics.storeError()
		}
		return fmt.Errorf("pop: store: %w", err)
	}
	admitted := limit.Admit(s.items, s.out)
	if !admitted {
		res.Code = OverLimit
		// No bits while the region is cut off: a key over its reduced share
		// is not over the limit once the link heals, and a bit would outlive
		// the partition everywhere it travels.
		if e.mit != nil && hits == 1 && share == 0 {
			e.issue(s, nowNs)
		}
	}
	for i, l := range s.limits {
		d := s.out[i]
		e.metrics.decision(l, d.Allowed, admitted)
		if l.Shadow {
			continue
		}
		st := &res.Statuses[s.owner[i]]
		if morePressing(d, st) {
			*st = Status{Limit: l, Remaining: d.Remaining, Reset: time.Duration(d.Reset), RetryAfter: time.Duration(d.RetryAfter)}
			if !d.Allowed {
				st.Code = OverLimit
			}
		}
	}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Limit == nil {
			continue
		}
		if res.Decisive < 0 || statusMorePressing(st, &res.Statuses[res.Decisive]) {
			res.Decisive = i
		}
	}
	return nil
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
// denied while one would fit, so only single hits issue bits.
func (e *Engine) issue(s *scratch, nowNs int64) {
	for i, l := range s.limits {
		d := s.out[i]
		if d.Allowed || l.Shadow || l.Scope == limit.ScopePOP || d.Remaining != 0 {
			continue
		}
		until := nowNs + d.RetryAfter
		if l.Mitigation > 0 {
			until = nowNs + int64(l.Mitigation)
		}
		e.mit.Issue(s.items[i].Key, l.Scope, until, nowNs)
	}
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
