package rules

import (
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
