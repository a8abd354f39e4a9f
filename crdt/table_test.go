package crdt

import (
	"strconv"
	"testing"
	"unsafe"
)

// TestTableGrow inserts enough keys to grow a table many times and checks
// that every key is still found, under its name, and that absent keys are
// not.
func TestTableGrow(t *testing.T) {
	var (
		h  hasher
		tb table[int]
	)
	const n = 10_000
	for i := range n {
		k := strconv.Itoa(i)
		if tb.find(h.string(k)) >= 0 {
			t.Fatalf("key %q found before insert", k)
		}
		tb.slots[tb.insert(h.string(k), k)].v = i
		if 2*tb.n > len(tb.slots) {
			t.Fatalf("load %d/%d above one half", tb.n, len(tb.slots))
		}
	}
	for i := range n {
		k := strconv.Itoa(i)
		j := tb.find(h.bytes([]byte(k)))
		if j < 0 || tb.slots[j].v != i || tb.keys[j] != k {
			t.Fatalf("key %q: slot %d", k, j)
		}
	}
	if tb.find(h.string("absent")) >= 0 {
		t.Fatal("absent key found")
	}
}

// TestWindowsOrder checks that windows stay sorted whatever order they are
// made in, and that dropBefore removes exactly the earlier ones.
func TestWindowsOrder(t *testing.T) {
	var ws windows[int]
	for _, w := range []int64{5, 1, 3, 9, 3, 7, -2} {
		ws.open(w).count++
	}
	var got []int64
	for _, w := range ws {
		got = append(got, w.start)
	}
	want := []int64{-2, 1, 3, 5, 7, 9}
	if len(got) != len(want) {
		t.Fatalf("windows %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] || ws.get(want[i]) != ws[i] {
			t.Fatalf("windows %v, want %v", got, want)
		}
	}
	if ws.get(4) != nil {
		t.Fatal("window 4 found")
	}
	if slots, _ := ws.dropBefore(5); slots != 4 || len(ws) != 3 || ws[0].start != 5 {
		t.Fatalf("dropBefore(5): %d slots, %d windows left", slots, len(ws))
	}
}

// TestWindowReserve: a new window is sized for the largest window held, so
// that filling it to that many keys never grows it, and it still grows past.
func TestWindowReserve(t *testing.T) {
	var (
		h  hasher
		ws windows[int]
	)
	first := ws.open(1)
	for i := range 1000 {
		k := strconv.Itoa(i)
		first.insert(h.string(k), k)
	}
	next := ws.open(2)
	size := len(next.slots)
	if size < 2*1000 {
		t.Fatalf("new window has %d slots for the 1000 keys of the last", size)
	}
	for i := range 1000 {
		k := strconv.Itoa(i)
		next.insert(h.string(k), k)
	}
	if len(next.slots) != size {
		t.Fatalf("window grew from %d to %d slots filling it to the reserved keys", size, len(next.slots))
	}
	for i := 1000; i < 3000; i++ {
		k := strconv.Itoa(i)
		next.insert(h.string(k), k)
	}
	for i := range 3000 {
		if next.find(h.string(strconv.Itoa(i))) < 0 {
			t.Fatalf("key %d lost after growing past the reserve", i)
		}
	}
}

// TestCountsSlotSize: a Counters slot stays 24 bytes without pointers (see
// counts).
func TestCountsSlotSize(t *testing.T) {
	if n := unsafe.Sizeof(entry[counts]{}); n != 24 {
		t.Fatalf("a Counters slot is %d bytes, want 24", n)
	}
}
