package region

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	top, err := Parse("eu=eu-1, eu-2; us=us-1;")
	if err != nil {
		t.Fatal(err)
	}
	if got := top.Names(); !slices.Equal(got, []string{"eu", "us"}) {
		t.Fatalf("regions %v", got)
	}
	if top.RegionOf("eu-2") != "eu" || top.RegionOf("nope") != "" {
		t.Fatal("RegionOf")
	}
	if got := top.Peers("eu-1"); !slices.Equal(got, []string{"eu-2"}) {
		t.Fatalf("peers of eu-1: %v", got)
	}
	if got := top.Others("eu-1"); !slices.Equal(got, []string{"eu-2", "us-1"}) {
		t.Fatalf("others of eu-1: %v", got)
	}
	for _, bad := range []struct{ in, want string }{
		{"eu=a;us=a", `PoP "a" is in both eu and us`},
		{"a,b", "want region=pop"},
		{"=a", "want region=pop"},
	} {
		if _, err := Parse(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Parse(%q) = %v, want %q", bad.in, err, bad.want)
		}
	}
}

func TestShare(t *testing.T) {
	cases := []struct {
		reach, total int
		per, want    float64
	}{
		{3, 3, 0, 1},
		{1, 3, 0, 1.0 / 3},
		{2, 3, 0, 2.0 / 3},
		{1, 2, 0.75, 0.75},
		{2, 3, 0.75, 1},
		{0, 3, 0, 1.0 / 3}, // a PoP reaches its own region at least
		{1, 0, 0, 1},
	}
	for _, c := range cases {
		if got := Share(c.reach, c.total, c.per); got != c.want {
			t.Errorf("Share(%d, %d, %v) = %v, want %v", c.reach, c.total, c.per, got, c.want)
		}
	}
	// The default shares of the sides of any partition sum to one limit.
	if sum := Share(1, 4, 0) + Share(3, 4, 0); sum != 1 {
		t.Fatalf("sides sum to %v", sum)
	}
}

func TestMember(t *testing.T) {
	top, err := Parse("eu=eu-1,eu-2;us=us-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		region, pop string
		want        bool
	}{
		{"eu", "eu-1", true},
		{"us", "us-1", true},
		{"us", "eu-1", false}, // a PoP of eu naming region us
		{"eu", "eu-9", false}, // a replica outside the topology
		{"ap", "ap-1", false}, // a region outside the topology
		{"", "", false},
	} {
		if got := top.Member(c.region, c.pop); got != c.want {
			t.Errorf("Member(%q, %q) = %v, want %v", c.region, c.pop, got, c.want)
		}
	}
	if (Topology{}).Member("eu", "eu-1") {
		t.Error("the zero topology has a member")
	}
}

// TestReachabilityShift: after the clock it reads moves forward by 2 s, a
// region heard 1.5 s before is still 1.5 s old, not 3.5 s: a clock correction
// alone does not cut a region off.
func TestReachabilityShift(t *testing.T) {
	const s = int64(time.Second)
	topo := Topology{Regions: map[string][]string{"eu": {"fra1"}, "us": {"iad1"}}}
	r := NewReachability(topo, "eu", 0)
	r.Heard("us", 10*s)
	if got := r.Unreachable(13*s+s/2, 3*s); len(got) != 1 {
		t.Fatalf("us heard 3.5 s ago is reachable within 3 s: %v", got)
	}
	r.Shift(2 * s)
	if got := r.Unreachable(13*s+s/2, 3*s); len(got) != 0 {
		t.Fatalf("after a shift of 2 s, us heard 1.5 s ago counts as cut off: %v", got)
	}
	if got := r.Unreachable(15*s+s/2, 3*s); len(got) != 1 {
		t.Fatalf("us heard 3.5 s ago (shifted) is still reachable: %v", got)
	}
}
