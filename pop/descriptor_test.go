package pop

import (
	"context"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/rules"
)

func ptr[T any](v T) *T { return &v }

// TestEmptyDescriptor: a descriptor without entries matches nothing and is
// answered OK, as Envoy's ratelimit answers it.
func TestEmptyDescriptor(t *testing.T) {
	e := newTestEngine(t)
	var res Result
	r := &Request{Domain: "api", Descriptors: []Descriptor{{}}}
	if err := e.CheckAt(context.Background(), t0, r, &res); err != nil || res.Code != OK || len(res.Statuses) != 1 || res.Statuses[0].Limit != nil {
		t.Fatalf("got %v %+v", err, res)
	}
}

// TestDescriptorHits: each descriptor counts its own hits_addend; 0 counts
// nothing and says whether one more hit fits.
func TestDescriptorHits(t *testing.T) {
	e := newTestEngine(t)
	ctx := context.Background()
	var res Result
	ip := func(h *int64) Descriptor {
		return Descriptor{Entries: []rules.Entry{{Key: "remote_address", Value: "9.9.9.9"}}, HitsAddend: h}
	}
	key := func(h *int64) Descriptor {
		return Descriptor{Entries: []rules.Entry{{Key: "api_key", Value: "k1"}}, HitsAddend: h}
	}
	// remote_address 30/min counts 10, api_key 100/min counts 3 (the request's).
	r := &Request{Domain: "api", HitsAddend: 3, Descriptors: []Descriptor{ip(ptr(int64(10))), key(nil)}}
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OK {
		t.Fatalf("%v %+v", err, res)
	}
	if got := [2]int64{res.Statuses[0].Remaining, res.Statuses[1].Remaining}; got != [2]int64{20, 97} {
		t.Fatalf("remaining %v, want [20 97]", got)
	}
	// A check-only descriptor sees the room and spends none.
	for range 2 {
		r = &Request{Domain: "api", Descriptors: []Descriptor{ip(ptr(int64(0)))}}
		if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OK || res.Statuses[0].Remaining != 20 {
			t.Fatalf("peek: %v %+v", err, res.Statuses)
		}
	}
	// Fill remote_address; a peek then reports OVER_LIMIT with no room.
	r = &Request{Domain: "api", HitsAddend: 20, Descriptors: []Descriptor{ip(nil)}}
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OK || res.Statuses[0].Remaining != 0 {
		t.Fatalf("fill: %v %+v", err, res.Statuses)
	}
	// A request whose peeked descriptor is over is denied and spends
	// nothing on its other descriptors.
	r = &Request{Domain: "api", Descriptors: []Descriptor{ip(ptr(int64(0))), key(ptr(int64(5)))}}
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OverLimit || res.Statuses[0].Code != OverLimit || res.Statuses[0].RetryAfter <= 0 {
		t.Fatalf("peek over: %v %+v", err, res.Statuses)
	}
	if res.Statuses[1].Code != OK || res.Statuses[1].Remaining != 97 {
		t.Fatalf("api_key after a denial: %+v, want OK with 97 left (nothing spent)", res.Statuses[1])
	}
}

// TestOverride: a descriptor's own limit replaces the rule's for this
// request, on the same counts when the unit is the rule's.
func TestOverride(t *testing.T) {
	e := newTestEngine(t)
	ctx := context.Background()
	var res Result
	d := func(o *Override) *Request {
		return &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "remote_address", Value: "8.8.8.8"}}, Limit: o}}}
	}
	for i := range 5 {
		if err := e.CheckAt(ctx, t0, d(&Override{RequestsPerUnit: 5, Unit: rules.Minute}), &res); err != nil || res.Code != OK {
			t.Fatalf("hit %d: %v %+v", i, err, res.Statuses)
		}
	}
	if err := e.CheckAt(ctx, t0, d(&Override{RequestsPerUnit: 5, Unit: rules.Minute}), &res); err != nil || res.Code != OverLimit {
		t.Fatalf("6th hit: %v %+v", err, res.Statuses)
	}
	if l := res.Statuses[0].Limit; l.Spec.Limit != 5 || l.Unit != rules.Minute || l.Name != "remote_address" {
		t.Fatalf("limit %+v", l)
	}
	// The rule's own 30/min counted the same 5 hits.
	if err := e.CheckAt(ctx, t0, d(nil), &res); err != nil || res.Statuses[0].Remaining != 24 {
		t.Fatalf("rule after override: %v %+v", err, res.Statuses)
	}
	// Another unit counts apart.
	if err := e.CheckAt(ctx, t0, d(&Override{RequestsPerUnit: 2, Unit: rules.Hour}), &res); err != nil || res.Code != OK || res.Statuses[0].Remaining != 1 {
		t.Fatalf("hour override: %v %+v", err, res.Statuses)
	}
	// A descriptor no rule matches is limited by its override alone;
	// an unknown domain still answers OK.
	free := &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "nothing", Value: "x"}}, Limit: &Override{RequestsPerUnit: 1, Unit: rules.Second}}}}
	for i, want := range []Code{OK, OverLimit, OK} {
		at := t0.Add(time.Duration(i/2) * 2 * time.Second)
		if err := e.CheckAt(ctx, at, free, &res); err != nil || res.Code != want {
			t.Fatalf("unmatched override, check %d: %v %v, want %v", i, err, res.Code, want)
		}
	}
	if res.Statuses[0].Limit.Name != "override" {
		t.Fatalf("policy name %q, want override", res.Statuses[0].Limit.Name)
	}
	free.Domain = "nowhere"
	if err := e.CheckAt(ctx, t0, free, &res); err != nil || res.Code != OK || res.Statuses[0].Limit != nil {
		t.Fatalf("unknown domain: %v %+v", err, res.Statuses)
	}
	// An unlimited descriptor with an override is limited (as in Envoy).
	un := &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "internal", Value: "x"}}, Limit: &Override{RequestsPerUnit: 0, Unit: rules.Minute}}}}
	if err := e.CheckAt(ctx, t0, un, &res); err != nil || res.Code != OverLimit {
		t.Fatalf("unlimited with override 0: %v %+v", err, res.Statuses)
	}
}
