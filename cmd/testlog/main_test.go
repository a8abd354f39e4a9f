package main

import (
	"os"
	"strings"
	"testing"
)

// The streams in testdata are `go test -json` of small packages: one with a
// skipped, a passing and a failing test (with a subtest), one with a skip
// only, one that does not build.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		file     string
		rc       int
		want     []string // lines the output must hold
		mustNot  []string // and must not
		wantSkip int
	}{
		{"pass.json", 0, []string{"--- SKIP: TestSkip: b_test.go:3: no root", "ok  \ttl/b"}, []string{"=== RUN"}, 1},
		{"skip-fail.json", 1, []string{
			"--- SKIP: TestSkip: a_test.go:3: redis-server not found",
			"    a_test.go:5: boom", "--- FAIL: TestFail/sub", "FAIL\ttl/a", "ok  \ttl/b",
		}, []string{"=== RUN   TestOK", "=== RUN   TestSkip"}, 2},
		{"build-fail.json", 1, []string{"c/c.go:1:23: undefined: undefined", "FAIL\ttl/c [build failed]"}, nil, 0},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var out strings.Builder
			if rc := run(f, &out); rc != tc.rc {
				t.Errorf("exit %d, want %d", rc, tc.rc)
			}
			got := out.String()
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q:\n%s", w, got)
				}
			}
			for _, w := range tc.mustNot {
				if strings.Contains(got, w) {
					t.Errorf("output has %q:\n%s", w, got)
				}
			}
			if n := strings.Count(got, "--- SKIP:"); n != tc.wantSkip {
				t.Errorf("%d skip lines, want %d:\n%s", n, tc.wantSkip, got)
			}
		})
	}
}

// A package that started and never reported — a crash, a timeout's panic
// cut short — fails the run, and its output is shown.
func TestUnfinished(t *testing.T) {
	in := `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestX"}
{"Action":"output","Package":"p","Test":"TestX","Output":"panic: test timed out after 15m0s\n"}
`
	var out strings.Builder
	if rc := run(strings.NewReader(in), &out); rc != 1 {
		t.Errorf("exit %d, want 1", rc)
	}
	if !strings.Contains(out.String(), "panic: test timed out") {
		t.Errorf("output lacks the panic:\n%s", out.String())
	}
}
