package escrow

import (
	"errors"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
)

func TestNewsRoundTrip(t *testing.T) {
	for _, n := range []News{
		{From: "eu-1", Incarnation: 1_800_000_000_000_000_000, SentAt: 1_800_000_000_500_000_000},
		{From: "us-2", Incarnation: 0, SentAt: 0},
		{From: "ap-1", Incarnation: 3, Partial: true},
	} {
		s := EncodeNews(n)
		if !IsNews(s) || IsSlot(s) {
			t.Fatalf("%v: IsNews %v, IsSlot %v; want a news slot only", s, IsNews(s), IsSlot(s))
		}
		got, err := DecodeNews(s)
		if err != nil || got != n {
			t.Fatalf("DecodeNews(EncodeNews(%v)) = %v, %v", n, got, err)
		}
	}
}

func TestNewsRejects(t *testing.T) {
	good := EncodeNews(News{From: "eu-1", Incarnation: 5, SentAt: 7})
	for name, s := range map[string]crdt.Slot{
		"not news":            {Key: "k", Window: 1, Replica: "eu-1", Count: 1},
		"negative watermark":  {Key: good.Key, Window: -1, Replica: "eu-1", Count: 1},
		"incarnation too big": {Key: good.Key, Replica: "eu-1", Count: 1 << 63},
		"empty sender":        {Key: good.Key, Replica: "", Count: 1},
		"zero byte in sender": {Key: good.Key, Replica: "eu\x001", Count: 1},
	} {
		if _, err := DecodeNews(s); !errors.Is(err, ErrBadSlot) {
			t.Errorf("%s: err = %v, want ErrBadSlot", name, err)
		}
	}
}
