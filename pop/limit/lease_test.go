package limit

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestLeaseToken(t *testing.T) {
	l := Lease{ID: LeaseID{1, 2, 3}, Keys: []SlotKey{SlotKeyOf([]byte("a")), SlotKeyOf([]byte("b"))}}
	tok := l.String()
	if strings.ContainsAny(tok, "+/=") {
		t.Fatalf("token %q is not URL-safe", tok)
	}
	got, err := ParseLease(tok)
	if err != nil || got.ID != l.ID || !slices.Equal(got.Keys, l.Keys) {
		t.Fatalf("ParseLease(String()) = %+v, %v; want %+v", got, err, l)
	}
	full := Lease{Keys: make([]SlotKey, MaxLeaseKeys)}
	if _, err := ParseLease(full.String()); err != nil {
		t.Fatalf("a lease of %d keys: %v", MaxLeaseKeys, err)
	}
	for _, bad := range []string{"", "abc", "!!!!", tok[:len(tok)-1], strings.Repeat("A", 4000),
		Lease{ID: l.ID}.String(), // no keys
		"Ag" + tok[2:],           // version 2
	} {
		if _, err := ParseLease(bad); !errors.Is(err, ErrBadLease) {
			t.Errorf("ParseLease(%.20q) = %v, want ErrBadLease", bad, err)
		}
	}
}

// Any string either parses into a lease that encodes back to itself or is
// ErrBadLease; nothing panics.
func FuzzParseLease(f *testing.F) {
	f.Add(Lease{Keys: []SlotKey{{1}}}.String())
	f.Add("AQ")
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLease(s)
		if err != nil {
			if !errors.Is(err, ErrBadLease) {
				t.Fatalf("error %v does not wrap ErrBadLease", err)
			}
			return
		}
		if l.String() != s {
			t.Fatalf("%q parsed but encodes as %q", s, l.String())
		}
	})
}

func TestDecideSlot(t *testing.T) {
	it := SlotItem{Max: 2, TTL: 100}
	for _, c := range []struct {
		inFlight, oldest int64
		taken            bool
		want             SlotDecision
	}{
		{0, 0, true, SlotDecision{Allowed: true, InFlight: 1, Remaining: 1}},
		{1, 0, false, SlotDecision{Allowed: true, InFlight: 1, Remaining: 1}},
		{1, 0, true, SlotDecision{Allowed: true, InFlight: 2, Remaining: 0}},
		{2, 1050, false, SlotDecision{InFlight: 2, RetryAfter: 50}},
		{2, 1000, false, SlotDecision{InFlight: 2, RetryAfter: 1}}, // never 0 when denied
	} {
		if got := DecideSlot(it, c.inFlight, c.oldest, 1000, c.taken); got != c.want {
			t.Errorf("DecideSlot(%d in flight, taken %v) = %+v, want %+v", c.inFlight, c.taken, got, c.want)
		}
	}
}
