package webhook

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

func BenchmarkSign(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 1024)
	for _, n := range []int{1, 2} {
		b.Run(strconv.Itoa(n)+"secrets", func(b *testing.B) {
			s, err := newSigner([]string{testSecret, testSecret2}[:n])
			if err != nil {
				b.Fatal(err)
			}
			var buf [128]byte
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				s.appendSignatures(buf[:0], "orders:8266000000000000000001", "1772600767", ptr(oneBody(body)))
			}
		})
	}
}

// benchServer is a minimal receiver: it reads the body and answers 204.
// CHANGEGATE_BENCH_URL points the benchmarks at an external receiver
// instead (e.g. another process), so that the CPU measured is the client's.
func benchServer(b *testing.B) *httptest.Server {
	if u := os.Getenv("CHANGEGATE_BENCH_URL"); u != "" {
		return &httptest.Server{URL: u}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func benchEvents(b *testing.B, n int) []*event.Event {
	evs := make([]*event.Event, n)
	for i := range evs {
		evs[i] = testEvent(b, i)
		envelope(b, evs[i], false) // encoded once, as the router does
	}
	return evs
}

func reportEventsPerSec(b *testing.B, perOp int) {
	b.ReportMetric(float64(b.N*perOp)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkSend measures one signed delivery per op against a local
// server, serially (latency) and from parallel workers (throughput).
func BenchmarkSend(b *testing.B) {
	srv := benchServer(b)
	w := newSink(b, Config{URL: srv.URL, Secrets: []string{testSecret}, AllowPrivateNetworks: true})
	evs := benchEvents(b, 1)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := w.Send(context.Background(), evs); err != nil {
				b.Fatal(err)
			}
		}
		reportEventsPerSec(b, 1)
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := w.Send(context.Background(), evs); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportEventsPerSec(b, 1)
	})
}

// BenchmarkSendBatch measures batches of 10 envelopes per request.
func BenchmarkSendBatch(b *testing.B) {
	srv := benchServer(b)
	w := newSink(b, Config{URL: srv.URL, Secrets: []string{testSecret}, BatchSize: 10, AllowPrivateNetworks: true})
	evs := benchEvents(b, 10)
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := w.Send(context.Background(), evs); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportEventsPerSec(b, len(evs))
}

// BenchmarkBareHTTP is the ceiling: a plain net/http POST of the same body
// with a comparable pool, no signing, no retry wrapper.
func BenchmarkBareHTTP(b *testing.B) {
	srv := benchServer(b)
	body := envelope(b, benchEvents(b, 1)[0], false)
	c := &http.Client{Transport: &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}}
	b.Cleanup(c.CloseIdleConnections)
	post := func() error {
		resp, err := c.Post(srv.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := post(); err != nil {
				b.Fatal(err)
			}
		}
		reportEventsPerSec(b, 1)
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := post(); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportEventsPerSec(b, 1)
	})
}

// BenchmarkSendBatchEncode measures a batch of 100 changes per request
// as a lane sends them: events freshly read (nothing encoded yet), so
// each op encodes 100 envelopes and posts them. "exclusive" events are
// routed to this sink alone (encoded straight into the request body),
// "shared" ones to several sinks (encoded into the event's cache, then
// copied into the body).
func BenchmarkSendBatchEncode(b *testing.B) {
	srv := benchServer(b)
	w := newSink(b, Config{URL: srv.URL, Secrets: []string{testSecret}, BatchSize: 100, AllowPrivateNetworks: true})
	raws := make([]bson.Raw, 100)
	for i, e := range benchEvents(b, 100) {
		raws[i] = e.Raw
	}
	for _, exclusive := range []bool{false, true} {
		name := "shared"
		if exclusive {
			name = "exclusive"
		}
		b.Run(name, func(b *testing.B) {
			evs := make([]*event.Event, len(raws))
			b.ReportAllocs()
			for b.Loop() {
				for i, raw := range raws {
					e, err := event.FromChange("orders", uint64(i), raw)
					if err != nil {
						b.Fatal(err)
					}
					e.Rules = []string{"paid"}
					e.Exclusive = exclusive
					evs[i] = e
				}
				if err := w.Send(context.Background(), evs); err != nil {
					b.Fatal(err)
				}
			}
			reportEventsPerSec(b, len(raws))
		})
	}
}
