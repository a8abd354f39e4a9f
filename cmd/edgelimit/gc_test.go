package main

import (
	"os"
	"runtime/debug"
	"testing"
)

// --gc-percent sets the collector's target, unless GOGC is in the
// environment, which wins as it does for any Go program; 0 leaves Go's.
func TestSetGCPercent(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	if v, ok := os.LookupEnv("GOGC"); ok {
		t.Cleanup(func() { os.Setenv("GOGC", v) })
	}
	os.Unsetenv("GOGC")

	if err := setGCPercent(400); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 400 {
		t.Fatalf("GC percent %d after --gc-percent 400", got)
	}
	if err := setGCPercent(0); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GC percent %d after --gc-percent 0, want Go's 100", got)
	}
	t.Setenv("GOGC", "150")
	if err := setGCPercent(400); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GC percent %d with GOGC in the environment, want it untouched", got)
	}
	if err := setGCPercent(-1); err == nil {
		t.Fatal("--gc-percent -1 accepted")
	}
}
