package strong

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestPickIsDeterministicAndSpreads(t *testing.T) {
	names := []string{"ap", "eu", "sa", "us"}
	counts := map[string]int{}
	for i := range 4000 {
		key := fmt.Sprintf("key-%d", i)
		a, err := Pick(key, names)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Pick(key, slices.Clone(names))
		if a != b {
			t.Fatalf("Pick(%q) gave %q then %q", key, a, b)
		}
		if !slices.Contains(names, a) {
			t.Fatalf("Pick(%q) = %q, not a candidate", key, a)
		}
		counts[a]++
	}
	for _, n := range names {
		// 1000 expected each; a fair hash stays well within ±20%.
		if c := counts[n]; c < 800 || c > 1200 {
			t.Errorf("%s is home to %d of 4000 keys, want about 1000: %v", n, c, counts)
		}
	}
}

func TestPickRefusesBadCandidates(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{nil, "no candidates"},
		{[]string{"us", "eu"}, "not sorted"},
		{[]string{"eu", "eu"}, "named twice"},
	} {
		if _, err := Pick("k", tc.names); err == nil || !contains(err.Error(), tc.want) {
			t.Errorf("Pick(%q) = %v, want an error saying %q", tc.names, err, tc.want)
		}
	}
}

func TestHomeOf(t *testing.T) {
	regions := map[string][]string{"us": {"us-b", "us-a"}, "eu": {"eu-a"}}
	h, err := HomeOf("k", regions, "")
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := Pick("k", []string{"eu", "us"})
	p, _ := Pick("k", slices.Sorted(slices.Values(regions[reg])))
	if h != (Home{reg, p}) {
		t.Errorf("HomeOf = %+v, want {%s %s}", h, reg, p)
	}
	// The order a topology lists its PoPs in does not move a home.
	for i := range 200 {
		key := fmt.Sprintf("k%d", i)
		a, _ := HomeOf(key, regions, "")
		b, _ := HomeOf(key, map[string][]string{"us": {"us-a", "us-b"}, "eu": {"eu-a"}}, "")
		if a != b {
			t.Fatalf("%s: home %+v, and %+v with the PoPs listed in another order", key, a, b)
		}
	}
	h, err = HomeOf("k", regions, "eu")
	if err != nil || h != (Home{"eu", "eu-a"}) {
		t.Errorf("configured eu: %+v, %v", h, err)
	}
	if _, err := HomeOf("k", regions, "ap"); err == nil || !contains(err.Error(), `"ap" is not one of`) {
		t.Errorf("configured unknown region: %v", err)
	}
	if _, err := HomeOf("k", map[string][]string{"eu": nil}, ""); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("a region without PoPs: %v, want ErrNoCandidates", err)
	}
}

func TestRTTTimeout(t *testing.T) {
	const ms = int64(1e6)
	r := RTT{Floor: 20 * ms, Initial: 1000 * ms}
	if got := r.Timeout(); got != 1000*ms {
		t.Errorf("before any sample: %d, want Initial", got)
	}
	r.Observe(100 * ms)
	// First sample: SRTT = R, RTTVAR = R/2 (RFC 6298 2.2).
	if got := r.Timeout(); got != 300*ms {
		t.Errorf("after one 100 ms sample: %dms, want 300", got/ms)
	}
	for range 100 {
		r.Observe(100 * ms)
	}
	if got := r.Timeout(); got < 100*ms || got > 110*ms {
		t.Errorf("after a steady 100 ms: %dms, want just over 100", got/ms)
	}
	for range 100 {
		r.Observe(1 * ms)
	}
	if got := r.Timeout(); got != 20*ms {
		t.Errorf("after a steady 1 ms: %dms, want the floor 20", got/ms)
	}
	r.Observe(-5)
	if srtt, _, _ := r.Smoothed(); srtt < 0 {
		t.Errorf("a negative sample moved SRTT to %d", srtt)
	}
	// A jittery round trip waits longer than its mean.
	j := RTT{}
	for i := range 200 {
		j.Observe(int64(50+100*(i%2)) * ms)
	}
	if got := j.Timeout(); got < 250*ms {
		t.Errorf("50/150 ms alternating: timeout %dms, want at least mean + 4·deviation ≈ 300", got/ms)
	}
}

func TestRTTLeavesALostHomeAlone(t *testing.T) {
	const ms = int64(1e6)
	r := RTT{Floor: 100 * ms, Initial: 100 * ms, MaxBackoff: 350 * ms}
	if to, ok := r.Ask(0); !ok || to != 100*ms {
		t.Fatalf("fresh: Ask = %d, %v", to, ok)
	}
	r.Lost(0)
	if _, ok := r.Ask(99 * ms); ok {
		t.Error("asked 99 ms after a loss, within the pause of one timeout")
	}
	if _, ok := r.Ask(100 * ms); !ok {
		t.Error("not asked once the pause of one timeout ended")
	}
	r.Lost(100 * ms) // pause 200 ms
	if _, ok := r.Ask(299 * ms); ok {
		t.Error("the second loss in a row did not double the pause")
	}
	r.Lost(300 * ms) // 400, bounded to 350
	if _, ok := r.Ask(650 * ms); !ok {
		t.Error("the pause passed MaxBackoff")
	}
	r.Observe(10 * ms)
	if _, ok := r.Ask(651 * ms); !ok {
		t.Error("a reply did not end the pause")
	}
	r.Lost(700 * ms)
	if _, ok := r.Ask(700*ms + r.Timeout()); !ok {
		t.Error("after a reply, the next loss did not start again from one timeout")
	}
}

func TestUnreachable(t *testing.T) {
	if Unreachable(true) != Deny || Unreachable(false) != Local {
		t.Errorf("fail_closed → %v, otherwise → %v", Unreachable(true), Unreachable(false))
	}
}

func TestWireRoundTrip(t *testing.T) {
	req := Request{ID: 7, Key: "global\x00k", Spec: Spec{Algorithm: 1, Limit: 100, Window: 1e9, Burst: 0}, Hits: 3}
	got, err := DecodeRequest(AppendRequest(nil, &req))
	if err != nil || got != req {
		t.Fatalf("request round trip: %+v, %v", got, err)
	}
	rep := Reply{ID: 7, Key: req.Key, Allowed: true, Remaining: 97, Reset: 5e8}
	gotRep, err := DecodeReply(AppendReply(nil, &rep))
	if err != nil || gotRep != rep {
		t.Fatalf("reply round trip: %+v, %v", gotRep, err)
	}
	if err := CheckReply(&req, &gotRep); err != nil {
		t.Fatalf("a true reply: %v", err)
	}
}

func TestCheckReplyRefuses(t *testing.T) {
	req := Request{ID: 7, Key: "k", Spec: Spec{Limit: 100, Window: 1e9}, Hits: 1}
	good := Reply{ID: 7, Key: "k", Allowed: true, Remaining: 99, Reset: 1e9}
	for _, tc := range []struct {
		name string
		edit func(*Reply)
	}{
		{"another request", func(r *Reply) { r.ID = 8 }},
		{"another key", func(r *Reply) { r.Key = "j" }},
		{"negative remaining", func(r *Reply) { r.Remaining = -1 }},
		{"remaining over the limit", func(r *Reply) { r.Remaining = 101 }},
		{"reset past two windows", func(r *Reply) { r.Reset = 3e9 }},
		{"negative reset", func(r *Reply) { r.Reset = -1 }},
		{"admitted with a retry", func(r *Reply) { r.Retry = 5 }},
		{"negative retry", func(r *Reply) { r.Allowed, r.Retry = false, -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.edit(&r)
			if err := CheckReply(&req, &r); !errors.Is(err, ErrMalformed) {
				t.Errorf("CheckReply = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestDecodeRefusesBadRequests(t *testing.T) {
	ok := Request{ID: 1, Key: "k", Spec: Spec{Limit: 10, Window: 1e9}, Hits: 1}
	for _, tc := range []struct {
		name string
		edit func(*Request)
	}{
		{"empty key", func(r *Request) { r.Key = "" }},
		{"long key", func(r *Request) { r.Key = string(make([]byte, MaxKeyBytes+1)) }},
		{"negative hits", func(r *Request) { r.Hits = -1 }},
		{"zero window", func(r *Request) { r.Spec.Window = 0 }},
		{"negative limit", func(r *Request) { r.Spec.Limit = -1 }},
		{"unknown algorithm", func(r *Request) { r.Spec.Algorithm = MaxAlgorithm + 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.edit(&r)
			if _, err := DecodeRequest(AppendRequest(nil, &r)); !errors.Is(err, ErrMalformed) {
				t.Errorf("DecodeRequest = %v, want ErrMalformed", err)
			}
		})
	}
	b := AppendRequest(nil, &ok)
	for i := range len(b) {
		if _, err := DecodeRequest(b[:i]); err == nil {
			t.Errorf("a request cut to %d of %d bytes decoded", i, len(b))
		}
	}
	if _, err := DecodeRequest(append(b, 0)); err == nil {
		t.Error("a request with a trailing byte decoded")
	}
	if _, err := DecodeReply(b); err == nil {
		t.Error("a request decoded as a reply")
	}
}

// FuzzDecode: no input panics, and whatever decodes encodes back to itself.
func FuzzDecode(f *testing.F) {
	f.Add(AppendRequest(nil, &Request{ID: 1, Key: "k", Spec: Spec{Limit: 10, Window: 1e9}, Hits: 1}))
	f.Add(AppendReply(nil, &Reply{ID: 1, Key: "k", Allowed: true, Remaining: 9, Reset: 1e9}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, err := DecodeRequest(b); err == nil {
			if again, err := DecodeRequest(AppendRequest(nil, &q)); err != nil || again != q {
				t.Fatalf("request %+v re-decoded as %+v, %v", q, again, err)
			}
		}
		if r, err := DecodeReply(b); err == nil {
			if again, err := DecodeReply(AppendReply(nil, &r)); err != nil || again != r {
				t.Fatalf("reply %+v re-decoded as %+v, %v", r, again, err)
			}
		}
	})
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
