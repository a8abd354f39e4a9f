package rules

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/edgelimit/edgelimit/pop/limit"
)

func TestDescribeKey(t *testing.T) {
	l := &Limit{Domain: "api", Unit: Minute, Scope: ScopeGlobal, Spec: limit.Spec{Algorithm: limit.SlidingWindow}}
	key := string(l.AppendKey(nil, []Entry{{Key: "api_key", Value: "abc"}, {Key: "endpoint", Value: ""}}))
	if got, want := DescribeKey(key), "api api_key=abc endpoint= (minute sliding_window global)"; got != want {
		t.Fatalf("DescribeKey = %q, want %q", got, want)
	}
	if w, ok := KeyWindow(key); !ok || w.Minutes() != 1 {
		t.Fatalf("KeyWindow = %v %v", w, ok)
	}
	for _, bad := range []string{"", "\xff", "x", "\x03api\x00"} {
		if got := DescribeKey(bad); got == "" || got[0] != '"' {
			t.Errorf("DescribeKey(%q) = %q, want a quoted fallback", bad, got)
		}
	}
}

func TestParseKey(t *testing.T) {
	l := &Limit{Domain: "api", Unit: Hour, Scope: ScopeGlobal, Spec: limit.Spec{Algorithm: limit.FixedWindow}}
	in := []Entry{{Key: "api_key", Value: "a\x00b"}, {Key: "endpoint", Value: ""}}
	k, ok := ParseKey(string(l.AppendKey(nil, in)), nil)
	if !ok || k.Domain != "api" || !slices.Equal(k.Entries, in) || k.Unit != Hour || k.Scope != ScopeGlobal || k.Algorithm != limit.FixedWindow {
		t.Fatalf("ParseKey = %+v, %v", k, ok)
	}
	for _, bad := range []string{"", "\x05ab", "\x03api\x00\x00\x09\x02"} {
		if _, ok := ParseKey(bad, nil); ok {
			t.Errorf("ParseKey(%q) ok", bad)
		}
	}
}

func TestUvarint(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 300, 1 << 20, 1<<63 + 5} {
		b := binary.AppendUvarint(nil, v)
		for _, in := range [][]byte{b, b[:len(b)-1], append(b, 9)} {
			wn, ww := binary.Uvarint(in)
			gn, gw := uvarint(string(in))
			if wn != gn || ww != gw {
				t.Errorf("uvarint(%x) = %d, %d; binary.Uvarint %d, %d", in, gn, gw, wn, ww)
			}
		}
	}
}
