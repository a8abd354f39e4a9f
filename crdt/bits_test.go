package crdt_test

import (
	"math"
	"slices"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
)

const (
	scopeRegion uint8 = 1
	scopeGlobal uint8 = 2
)

func bit(key string, scope uint8, until int64, origin string) crdt.Bit {
	return crdt.Bit{Key: key, Scope: scope, Until: until, Origin: origin}
}

func TestBitsJoin(t *testing.T) {
	tests := []struct {
		name        string
		state, join []crdt.Bit
		wantChanged int
		want        []crdt.Bit // All(), in order
	}{
		{name: "nothing"},
		{
			name:        "one bit",
			join:        []crdt.Bit{bit("a", scopeGlobal, w1, "eu")},
			wantChanged: 1,
			want:        []crdt.Bit{bit("a", scopeGlobal, w1, "eu")},
		},
		{
			name:        "later until wins",
			state:       []crdt.Bit{bit("a", scopeGlobal, w1, "eu")},
			join:        []crdt.Bit{bit("a", scopeGlobal, w2, "us")},
			wantChanged: 1,
			want:        []crdt.Bit{bit("a", scopeGlobal, w2, "us")},
		},
		{
			name:  "earlier until loses",
			state: []crdt.Bit{bit("a", scopeGlobal, w2, "eu")},
			join:  []crdt.Bit{bit("a", scopeGlobal, w1, "us")},
			want:  []crdt.Bit{bit("a", scopeGlobal, w2, "eu")},
		},
		{
			name:        "tie broken by greater origin",
			state:       []crdt.Bit{bit("a", scopeGlobal, w1, "eu")},
			join:        []crdt.Bit{bit("a", scopeGlobal, w1, "us"), bit("a", scopeGlobal, w1, "ap")},
			wantChanged: 1,
			want:        []crdt.Bit{bit("a", scopeGlobal, w1, "us")},
		},
		{
			name:  "same bit again",
			state: []crdt.Bit{bit("a", scopeGlobal, w1, "eu")},
			join:  []crdt.Bit{bit("a", scopeGlobal, w1, "eu")},
			want:  []crdt.Bit{bit("a", scopeGlobal, w1, "eu")},
		},
		{
			name:        "scopes are separate registers",
			state:       []crdt.Bit{bit("a", scopeGlobal, w2, "eu")},
			join:        []crdt.Bit{bit("a", scopeRegion, w1, "eu"), bit("", 0, math.MinInt64, "")},
			wantChanged: 2,
			want: []crdt.Bit{
				bit("", 0, math.MinInt64, ""), bit("a", scopeRegion, w1, "eu"), bit("a", scopeGlobal, w2, "eu"),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s crdt.Bits
			s.Join(tt.state...)
			if got := s.Join(tt.join...); got != tt.wantChanged {
				t.Errorf("Join changed %d, want %d", got, tt.wantChanged)
			}
			if got := s.All(); !slices.Equal(got, tt.want) {
				t.Errorf("All() = %v\nwant %v", got, tt.want)
			}
			if s.Len() != len(tt.want) {
				t.Errorf("Len() = %d, want %d", s.Len(), len(tt.want))
			}
			for _, b := range tt.want {
				if got, ok := s.Get(b.Key, b.Scope); !ok || got != b {
					t.Errorf("Get(%q, %d) = %v, %v; want %v", b.Key, b.Scope, got, ok, b)
				}
			}
		})
	}
}

func TestBitsActiveExpire(t *testing.T) {
	all := []crdt.Bit{
		bit("a", scopeGlobal, w1, "eu"),
		bit("b", scopeRegion, w2, "us"),
		bit("c", scopeGlobal, w3, "eu"),
	}
	tests := []struct {
		name        string
		now         int64
		wantActive  []crdt.Bit
		wantExpired int
	}{
		{"before all", w0, all, 0},
		{"at an end the bit no longer holds", w1, all[1:], 1},
		{"between ends", w1 + 1, all[1:], 1},
		{"after all", w3, nil, 3},
		{"min time", math.MinInt64, all, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s crdt.Bits
			s.Join(all...)
			if got := s.Active(tt.now); !slices.Equal(got, tt.wantActive) {
				t.Errorf("Active(%d) = %v\nwant %v", tt.now, got, tt.wantActive)
			}
			if got := s.Expire(tt.now); got != tt.wantExpired {
				t.Errorf("Expire(%d) = %d, want %d", tt.now, got, tt.wantExpired)
			}
			if got := s.All(); !slices.Equal(got, tt.wantActive) {
				t.Errorf("after Expire All() = %v\nwant %v", got, tt.wantActive)
			}
			// A redelivered expired bit is held again but never active.
			s.Join(all...)
			if got := s.Active(tt.now); !slices.Equal(got, tt.wantActive) {
				t.Errorf("after redelivery Active(%d) = %v\nwant %v", tt.now, got, tt.wantActive)
			}
		})
	}
	t.Run("zero value", func(t *testing.T) {
		var s crdt.Bits
		if _, ok := s.Get("a", 0); ok || s.Active(0) != nil || s.All() != nil || s.Expire(0) != 0 || s.Len() != 0 {
			t.Error("zero Bits not empty")
		}
	})
}
