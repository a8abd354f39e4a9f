// Package limittest is the table of window and algorithm cases that every
// counter store must pass: the embedded store, the Redis Lua scripts and the
// simulator run the same cases, so they cannot drift apart. Each case is a
// timeline of checks at fixed instants with the decisions they must get.
package limittest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// Store is what the table drives: the store contract of limit.Decide behind
// whatever IO the store does.
type Store interface {
	CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error
}

// T0 is the table's epoch, 2024-01-23 08:54:00 UTC: a minute boundary
// (1706000040 is divisible by 60), the instant the seed documents' key example uses.
var T0 = time.Unix(1706000040, 0)

// Step is one or more identical checks at one instant.
type Step struct {
	At    time.Duration // offset from T0
	Limit []int         // indexes into Case.Limits the request matched
	Hits  int64         // hits per check; 0 means 1
	Times int           // identical checks to make; 0 means 1

	// Admitted is how many of the Times checks must be admitted.
	Admitted int
	// When set, the decisions of the last check must equal these (one per
	// limit in Limit). RetryAfter and Reset are compared to the nanosecond.
	Want []limit.Decision
}

// Case is a named timeline.
type Case struct {
	Name   string
	Limits []limit.Spec
	Shadow []bool // optional, per limit
	// CountDenied sets limit.Item.CountDenied on every item.
	CountDenied bool
	Steps       []Step
}

var (
	minute = int64(time.Minute)
	second = int64(time.Second)
	week   = int64(7 * 24 * time.Hour)
	month  = int64(30 * 24 * time.Hour)
	year   = int64(365 * 24 * time.Hour)
)

// Cases is the shared table.
var Cases = []Case{
	{
		// Seed 000 §4: capacity 200, 100/min; 150 at 0.1 s, 80 at 30 s, 50 at
		// 70 s, 50 at 75 s. At 75 s the bucket holds 200−150+29.9·(100/60)−80
		// +40·(100/60)−50+5·(100/60) = 44.83 tokens: 44 admitted, 6 denied.
		Name:   "token bucket seed timeline",
		Limits: []limit.Spec{{Algorithm: limit.TokenBucket, Limit: 100, Window: minute, Burst: 200}},
		Steps: []Step{
			{At: 100 * time.Millisecond, Times: 150, Admitted: 150},
			{At: 30 * time.Second, Times: 80, Admitted: 80},
			{At: 70 * time.Second, Times: 50, Admitted: 50},
			{At: 75 * time.Second, Times: 50, Admitted: 44, Want: []limit.Decision{{
				Allowed:   false,
				Remaining: 0,
				// 0.8333… tokens held, 1 needed: 0.1667 tokens at 100/60 per s = 100 ms.
				RetryAfter: 100 * int64(time.Millisecond),
				// Full again after 199.1667 tokens at 100/60 per s: 119.5 s.
				Reset: int64(119500 * time.Millisecond),
			}}},
		},
	},
	{
		// Seed 002: 100/min, 80 in the previous minute, 30 so far, 45 s in:
		// 80 × 0.25 + 30 = 50, so the check is allowed and 49 remain.
		Name:   "sliding window seed arithmetic",
		Limits: []limit.Spec{{Algorithm: limit.SlidingWindow, Limit: 100, Window: minute}},
		Steps: []Step{
			{At: 10 * time.Second, Times: 80, Admitted: 80},
			{At: 70 * time.Second, Times: 30, Admitted: 30},
			{At: 105 * time.Second, Admitted: 1, Want: []limit.Decision{{
				Allowed: true, Remaining: 49, Reset: 15 * second,
			}}},
		},
	},
	{
		// The boundary burst: a fixed window admits 100 at 59.9 s and 100 more at
		// 60.1 s — 200 in 0.2 s against a 100/min limit.
		Name:   "fixed window boundary burst",
		Limits: []limit.Spec{{Algorithm: limit.FixedWindow, Limit: 100, Window: minute}},
		Steps: []Step{
			{At: 59900 * time.Millisecond, Times: 100, Admitted: 100},
			{At: 59950 * time.Millisecond, Admitted: 0, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: 50 * int64(time.Millisecond), Reset: 50 * int64(time.Millisecond),
			}}},
			{At: 60100 * time.Millisecond, Times: 100, Admitted: 100},
		},
	},
	{
		// The same burst against a sliding window: at 60.1 s the previous
		// minute still weighs 100 × 59.9/60 = 99.83, so nothing more fits until
		// the estimate falls to 99: 100 × (60 − e)/60 ≤ 99 ⇔ e ≥ 0.6 s.
		Name:   "sliding window holds the boundary",
		Limits: []limit.Spec{{Algorithm: limit.SlidingWindow, Limit: 100, Window: minute}},
		Steps: []Step{
			{At: 59900 * time.Millisecond, Times: 100, Admitted: 100},
			{At: 60100 * time.Millisecond, Times: 100, Admitted: 0, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: 500 * int64(time.Millisecond), Reset: 59900 * int64(time.Millisecond),
			}}},
			{At: 60600 * time.Millisecond, Admitted: 1},
			{At: 60600 * time.Millisecond, Admitted: 0},
		},
	},
	{
		// A denial that must wait for the next window: cur alone is over.
		Name:   "sliding window retry in the next window",
		Limits: []limit.Spec{{Algorithm: limit.SlidingWindow, Limit: 10, Window: minute}},
		Steps: []Step{
			{At: 30 * time.Second, Times: 10, Admitted: 10},
			// Next window: 10 × (60 − e)/60 ≤ 9 ⇔ e ≥ 6 s, so 30 s + 6 s.
			{At: 30 * time.Second, Admitted: 0, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: 36 * second, Reset: 30 * second,
			}}},
			{At: 65 * time.Second, Admitted: 0},
			{At: 66 * time.Second, Admitted: 1},
		},
	},
	{
		Name:   "hits addend counts as many",
		Limits: []limit.Spec{{Algorithm: limit.FixedWindow, Limit: 10, Window: second}},
		Steps: []Step{
			{At: 0, Hits: 4, Times: 3, Admitted: 2},
			{At: 0, Hits: 2, Admitted: 1, Want: []limit.Decision{{Allowed: true, Remaining: 0, Reset: second}}},
			{At: 0, Hits: 11, Admitted: 0},
			{At: time.Second, Hits: 10, Admitted: 1},
		},
	},
	{
		Name:   "gcra burst then steady rate",
		Limits: []limit.Spec{{Algorithm: limit.GCRA, Limit: 10, Window: second}},
		Steps: []Step{
			{At: 0, Times: 12, Admitted: 10, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: 100 * int64(time.Millisecond), Reset: second,
			}}},
			{At: 100 * time.Millisecond, Times: 2, Admitted: 1},
			{At: 350 * time.Millisecond, Times: 3, Admitted: 2},
		},
	},
	{
		Name:   "gcra with a burst above the rate",
		Limits: []limit.Spec{{Algorithm: limit.GCRA, Limit: 60, Window: minute, Burst: 5}},
		Steps: []Step{
			{At: 0, Times: 6, Admitted: 5},
			{At: time.Second, Times: 2, Admitted: 1},
		},
	},
	{
		Name:   "sliding log is exact",
		Limits: []limit.Spec{{Algorithm: limit.SlidingLog, Limit: 3, Window: minute}},
		Steps: []Step{
			{At: 0, Admitted: 1},
			{At: 10 * time.Second, Admitted: 1},
			{At: 20 * time.Second, Admitted: 1},
			{At: 50 * time.Second, Admitted: 0, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: 10 * second, Reset: 30 * second,
			}}},
			{At: 60 * time.Second, Admitted: 1},
			{At: 60 * time.Second, Admitted: 0},
			{At: 70 * time.Second, Hits: 2, Admitted: 0, Want: []limit.Decision{{
				Remaining: 1, RetryAfter: 10 * second, Reset: 50 * second,
			}}},
		},
	},
	{
		Name:   "zero limit denies everything",
		Limits: []limit.Spec{{Algorithm: limit.SlidingWindow, Limit: 0, Window: second}},
		Steps:  []Step{{At: 0, Times: 3, Admitted: 0}},
	},
	{
		// requests_per_unit 0 denies every hit whatever the burst: a bucket
		// that never refills is no bucket.
		Name:   "zero limit with a burst denies everything",
		Limits: []limit.Spec{{Algorithm: limit.TokenBucket, Limit: 0, Window: second, Burst: 5}},
		Steps:  []Step{{At: 0, Times: 3, Admitted: 0}, {At: time.Hour, Admitted: 0}},
	},
	{
		// The strict limit denies; the generous one must not be charged.
		Name: "a denied request spends no quota",
		Limits: []limit.Spec{
			{Algorithm: limit.FixedWindow, Limit: 100, Window: minute},
			{Algorithm: limit.FixedWindow, Limit: 2, Window: minute},
		},
		Steps: []Step{
			{At: 0, Limit: []int{0, 1}, Times: 5, Admitted: 2, Want: []limit.Decision{
				{Allowed: true, Remaining: 98, Reset: minute},
				{Allowed: false, Remaining: 0, RetryAfter: minute, Reset: minute},
			}},
			{At: 0, Limit: []int{0}, Times: 98, Admitted: 98},
			{At: 0, Limit: []int{0}, Admitted: 0},
		},
	},
	{
		Name: "a shadow limit never denies and stops at its limit",
		Limits: []limit.Spec{
			{Algorithm: limit.FixedWindow, Limit: 100, Window: minute},
			{Algorithm: limit.FixedWindow, Limit: 2, Window: minute},
		},
		Shadow: []bool{false, true},
		Steps: []Step{
			{At: 0, Limit: []int{0, 1}, Times: 5, Admitted: 5, Want: []limit.Decision{
				{Allowed: true, Remaining: 95, Reset: minute},
				{Allowed: false, Remaining: 0, RetryAfter: minute, Reset: minute},
			}},
			{At: time.Minute, Limit: []int{1}, Times: 3, Admitted: 3},
		},
	},
	{
		// Two servers sharing a store, one 300 ms behind: its checks count in
		// the newest window instead of resurrecting an old one.
		Name:   "a lagging clock counts in the newest window",
		Limits: []limit.Spec{{Algorithm: limit.FixedWindow, Limit: 5, Window: second}},
		Steps: []Step{
			{At: 1100 * time.Millisecond, Times: 3, Admitted: 3},
			{At: 800 * time.Millisecond, Times: 3, Admitted: 2},
			{At: 2 * time.Second, Times: 5, Admitted: 5},
		},
	},
	{
		Name:   "a lagging clock never refills a bucket",
		Limits: []limit.Spec{{Algorithm: limit.TokenBucket, Limit: 10, Window: second}},
		Steps: []Step{
			{At: time.Second, Times: 10, Admitted: 10},
			{At: 700 * time.Millisecond, Times: 1, Admitted: 0},
			{At: 1100 * time.Millisecond, Times: 2, Admitted: 1},
		},
	},
	{
		Name:   "day windows align to UTC midnight",
		Limits: []limit.Spec{{Algorithm: limit.FixedWindow, Limit: 1, Window: int64(24 * time.Hour)}},
		Steps: []Step{
			// T0 is 08:54:00 UTC, so the day ends 15 h 6 min later.
			{At: 0, Admitted: 1},
			{At: 15*time.Hour + 5*time.Minute, Admitted: 0, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: minute, Reset: minute,
			}}},
			{At: 15*time.Hour + 6*time.Minute, Admitted: 1},
		},
	},
	{
		// Envoy's way (CountDenied): denied hits count, so a request that
		// would fit after a denial of a larger one is denied too.
		Name:        "counting denied hits keeps a client over",
		Limits:      []limit.Spec{{Algorithm: limit.FixedWindow, Limit: 3, Window: minute}},
		CountDenied: true,
		Steps: []Step{
			{At: 0, Hits: 2, Admitted: 1},
			{At: time.Second, Hits: 2, Admitted: 0},
			{At: 2 * time.Second, Admitted: 0, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: 58 * second, Reset: 58 * second,
			}}},
			{At: time.Minute, Admitted: 1},
		},
	},
	{
		Name: "counting denied hits spends the limits that had room",
		Limits: []limit.Spec{
			{Algorithm: limit.SlidingWindow, Limit: 100, Window: minute},
			{Algorithm: limit.FixedWindow, Limit: 2, Window: minute},
		},
		CountDenied: true,
		Steps: []Step{
			{At: 0, Limit: []int{0, 1}, Times: 5, Admitted: 2, Want: []limit.Decision{
				{Allowed: true, Remaining: 95, Reset: minute},
				{Allowed: false, Remaining: 0, RetryAfter: minute, Reset: minute},
			}},
			{At: 0, Limit: []int{0}, Times: 96, Admitted: 95},
		},
	},
	{
		// Envoy's way counts a shadow (or quota-mode) limit's every hit:
		// past its limit, a request that would fit its count before the
		// denial no longer does, and it stays over for the window.
		Name:        "counting denied hits counts a shadow limit past its limit",
		Limits:      []limit.Spec{{Algorithm: limit.FixedWindow, Limit: 3, Window: minute}},
		Shadow:      []bool{true},
		CountDenied: true,
		Steps: []Step{
			{At: 0, Hits: 2, Admitted: 1, Want: []limit.Decision{{Allowed: true, Remaining: 1, Reset: minute}}},
			{At: time.Second, Hits: 2, Admitted: 1, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: 59 * second, Reset: 59 * second,
			}}},
			{At: 2 * time.Second, Admitted: 1, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: 58 * second, Reset: 58 * second,
			}}},
		},
	},
	{
		Name: "counting denied hits counts a shadow limit beside one that denies",
		Limits: []limit.Spec{
			{Algorithm: limit.FixedWindow, Limit: 1, Window: minute},
			{Algorithm: limit.FixedWindow, Limit: 3, Window: minute},
		},
		Shadow:      []bool{false, true},
		CountDenied: true,
		Steps: []Step{
			{At: 0, Limit: []int{0, 1}, Times: 3, Admitted: 1, Want: []limit.Decision{
				{Allowed: false, Remaining: 0, RetryAfter: minute, Reset: minute},
				{Allowed: true, Remaining: 0, Reset: minute},
			}},
			{At: 0, Limit: []int{1}, Admitted: 1, Want: []limit.Decision{
				{Allowed: false, Remaining: 0, RetryAfter: minute, Reset: minute},
			}},
		},
	},
	{
		// Without CountDenied a shadow limit stops counting at its limit.
		Name:   "a shadow limit stops counting at its limit",
		Limits: []limit.Spec{{Algorithm: limit.FixedWindow, Limit: 3, Window: minute}},
		Shadow: []bool{true},
		Steps: []Step{
			{At: 0, Hits: 2, Admitted: 1},
			{At: time.Second, Hits: 2, Admitted: 1, Want: []limit.Decision{{
				Remaining: 1, RetryAfter: 59 * second, Reset: 59 * second,
			}}},
			{At: 2 * time.Second, Admitted: 1, Want: []limit.Decision{{Allowed: true, Remaining: 0, Reset: 58 * second}}},
		},
	},
	// Long and custom windows (week, month, year, unit_multiplier): fixed
	// lengths aligned to the Unix epoch, as Envoy's ratelimit counts them.
	{
		// T0 is 464,040 s into the 30-day window that began 2024-01-18
		// 00:00 UTC (658 × 2,592,000 s after the epoch); the next begins
		// 2,127,960 s after T0.
		Name:   "month windows are 30 days from the epoch",
		Limits: []limit.Spec{{Algorithm: limit.FixedWindow, Limit: 2, Window: month}},
		Steps: []Step{
			{At: 0, Times: 3, Admitted: 2, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: 2127960 * second, Reset: 2127960 * second,
			}}},
			{At: 2127959 * time.Second, Admitted: 0},
			{At: 2127960 * time.Second, Times: 3, Admitted: 2},
		},
	},
	{
		// The 365-day window holding T0 began 2023-12-19 00:00 UTC (54 ×
		// 31,536,000 s); the next begins 28,479,960 s after T0. Half way
		// through it, the previous year's 10 weigh 5.
		Name:   "year sliding windows are 365 days from the epoch",
		Limits: []limit.Spec{{Algorithm: limit.SlidingWindow, Limit: 10, Window: year}},
		Steps: []Step{
			{At: 0, Times: 10, Admitted: 10},
			{At: 28479960 * time.Second, Admitted: 0},
			{At: (28479960 + 15768000) * time.Second, Times: 6, Admitted: 5},
		},
	},
	{
		Name:   "a week's token bucket refills a token a day",
		Limits: []limit.Spec{{Algorithm: limit.TokenBucket, Limit: 7, Window: week}},
		Steps: []Step{
			{At: 0, Times: 8, Admitted: 7},
			{At: 24 * time.Hour, Times: 2, Admitted: 1},
			{At: 72 * time.Hour, Times: 3, Admitted: 2},
		},
	},
	{
		Name:   "gcra over a year emits one a day",
		Limits: []limit.Spec{{Algorithm: limit.GCRA, Limit: 365, Window: year}},
		Steps: []Step{
			{At: 0, Times: 366, Admitted: 365},
			{At: 24 * time.Hour, Times: 2, Admitted: 1},
		},
	},
	{
		Name:   "sliding log over five minutes (unit_multiplier 5)",
		Limits: []limit.Spec{{Algorithm: limit.SlidingLog, Limit: 3, Window: 5 * minute}},
		Steps: []Step{
			{At: 0, Times: 3, Admitted: 3},
			{At: 5*time.Minute - time.Second, Admitted: 0},
			{At: 5*time.Minute + time.Millisecond, Times: 4, Admitted: 3},
		},
	},
	{
		// T0 is 240 s into its 5-minute window (windows start at multiples
		// of 300 s from the epoch), so the next starts 60 s later.
		Name:   "five-minute windows align to the epoch",
		Limits: []limit.Spec{{Algorithm: limit.FixedWindow, Limit: 1, Window: 5 * minute}},
		Steps: []Step{
			{At: 0, Admitted: 1},
			{At: 59 * time.Second, Admitted: 0, Want: []limit.Decision{{
				Remaining: 0, RetryAfter: second, Reset: second,
			}}},
			{At: 60 * time.Second, Admitted: 1},
		},
	},
}

// Run drives every case against a fresh store from newStore. Keys are unique
// per case, so one store may serve all cases.
func Run(t *testing.T, newStore func(t *testing.T) Store) {
	run := time.Now().UnixNano() // keeps keys apart from earlier runs on a shared store
	for ci, c := range Cases {
		t.Run(c.Name, func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			for si, step := range c.Steps {
				idx := step.Limit
				if idx == nil {
					idx = []int{0}
				}
				items := make([]limit.Item, len(idx))
				for i, li := range idx {
					items[i] = limit.Item{
						Key:  fmt.Appendf(nil, "limittest:%d:%d:%d", run, ci, li),
						Spec: c.Limits[li],
					}
					if c.Shadow != nil {
						items[i].Shadow = c.Shadow[li]
					}
					items[i].CountDenied = c.CountDenied
				}
				hits, times := max(step.Hits, 1), max(step.Times, 1)
				now := T0.Add(step.At).UnixNano()
				out := make([]limit.Decision, len(items))
				admitted := 0
				for range times {
					if err := s.CheckAt(ctx, now, hits, items, out); err != nil {
						t.Fatalf("step %d: CheckAt: %v", si, err)
					}
					if limit.Admit(items, out) {
						admitted++
					}
				}
				if admitted != step.Admitted {
					t.Errorf("step %d at %v: admitted %d of %d, want %d", si, step.At, admitted, times, step.Admitted)
				}
				if step.Want != nil {
					for i := range step.Want {
						if out[i] != step.Want[i] {
							t.Errorf("step %d at %v limit %d: got %+v, want %+v", si, step.At, idx[i], out[i], step.Want[i])
						}
					}
				}
			}
		})
	}
}
