package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks/webhook"
	"github.com/changegate/changegate/tracing"
)

// roleEnv names the child-process role when the bench binary re-executes
// itself (an environment variable rather than a flag, so that a test binary
// can play the roles too).
const roleEnv = "CHANGEGATE_BENCH_ROLE"

// roleResult is what a child role prints on stdout (one JSON line).
type roleResult struct {
	Events  int           `json:"events"`
	Elapsed time.Duration `json:"elapsed"` // first to last event
	CPU     time.Duration `json:"cpu"`     // during the same window
	HWM     int64         `json:"hwm"`     // peak RSS, bytes
	Err     string        `json:"err,omitempty"`
}

// runRole runs a child role and returns the process exit code.
func runRole(role string, args []string) int {
	var res roleResult
	var err error
	switch role {
	case "drain":
		res, err = roleDrain(args)
	case "http":
		res, err = roleHTTP(args)
	case "naive":
		res, err = roleNaive(args)
	case "minimal":
		res, err = roleMinimal(args)
	case "gateway":
		err = roleGateway(args)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench gateway:", err)
			return 1
		}
		return 0
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		res.Err = err.Error()
	}
	_, res.HWM, _ = procMem(os.Getpid())
	_ = json.NewEncoder(os.Stdout).Encode(res)
	if err != nil {
		return 1
	}
	return 0
}

type streamFlags struct {
	uri   string
	n     int
	start int64
}

func (f *streamFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.uri, "uri", "", "MongoDB URI")
	fs.IntVar(&f.n, "n", 0, "events to read")
	fs.Int64Var(&f.start, "start", 0, "startAtOperationTime, unix seconds")
}

// stream is a role's open change stream and its client.
type stream struct {
	*mongo.ChangeStream
	client *mongo.Client
}

// open parses the role's flags (fs, on which f is registered) and opens
// the change stream they name.
func (f *streamFlags) open(ctx context.Context, fs *flag.FlagSet, args []string) (stream, error) {
	if err := fs.Parse(args); err != nil {
		return stream{}, err
	}
	client, err := mongo.Connect(options.Client().ApplyURI(f.uri))
	if err != nil {
		return stream{}, err
	}
	opts := options.ChangeStream().SetMaxAwaitTime(time.Second)
	if f.start > 0 {
		opts.SetStartAtOperationTime(&bson.Timestamp{T: uint32(f.start)})
	}
	cs, err := client.Database(benchDB).Collection(benchColl).Watch(ctx, mongo.Pipeline{}, opts)
	if err != nil {
		_ = client.Disconnect(ctx)
		return stream{}, err
	}
	return stream{ChangeStream: cs, client: client}, nil
}

// close closes the stream, then its client.
func (s stream) close(ctx context.Context) {
	_ = s.Close(ctx)
	_ = s.client.Disconnect(ctx)
}

// roleDrain reads n events from the change stream and discards them: the
// source-side ceiling.
func roleDrain(args []string) (roleResult, error) {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	var sf streamFlags
	sf.register(fs)
	ctx := context.Background()
	cs, err := sf.open(ctx, fs, args)
	if err != nil {
		return roleResult{}, err
	}
	defer cs.close(ctx)
	var t0 time.Time
	var c0 time.Duration
	for i := 0; i < sf.n; i++ {
		if !cs.Next(ctx) {
			return roleResult{Events: i}, fmt.Errorf("stream ended after %d events: %v", i, cs.Err())
		}
		if i == 0 {
			t0, c0 = time.Now(), selfCPU()
		}
	}
	return roleResult{Events: sf.n, Elapsed: time.Since(t0), CPU: selfCPU() - c0}, nil
}

// roleNaive is the loop users write by hand: for each change, POST it as
// relaxed Extended JSON, then save the resume token with an upsert.
func roleNaive(args []string) (roleResult, error) {
	fs := flag.NewFlagSet("naive", flag.ContinueOnError)
	var sf streamFlags
	sf.register(fs)
	url := fs.String("url", "", "receiver URL")
	ctx := context.Background()
	cs, err := sf.open(ctx, fs, args)
	if err != nil {
		return roleResult{}, err
	}
	defer cs.close(ctx)
	tokens := cs.client.Database("naive").Collection("tokens")
	hc := &http.Client{Timeout: 10 * time.Second}
	var t0 time.Time
	var c0 time.Duration
	for i := 0; i < sf.n; i++ {
		if !cs.Next(ctx) {
			return roleResult{Events: i}, fmt.Errorf("stream ended after %d events: %v", i, cs.Err())
		}
		if i == 0 {
			t0, c0 = time.Now(), selfCPU()
		}
		body, err := bson.MarshalExtJSON(cs.Current, false, false)
		if err != nil {
			return roleResult{Events: i}, err
		}
		resp, err := hc.Post(*url, "application/json", bytes.NewReader(body))
		if err != nil {
			return roleResult{Events: i}, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return roleResult{Events: i}, fmt.Errorf("POST: %s", resp.Status)
		}
		_, err = tokens.UpdateOne(ctx, bson.D{{Key: "_id", Value: "orders"}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "token", Value: cs.ResumeToken()}}}},
			options.UpdateOne().SetUpsert(true))
		if err != nil {
			return roleResult{Events: i}, err
		}
	}
	return roleResult{Events: sf.n, Elapsed: time.Since(t0), CPU: selfCPU() - c0}, nil
}

// roleHTTP POSTs pre-encoded, pre-signed envelopes to the receiver from c
// concurrent workers over keep-alive connections: the sink-side ceiling.
func roleHTTP(args []string) (roleResult, error) {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	url := fs.String("url", "", "receiver URL")
	n := fs.Int("n", 0, "requests")
	c := fs.Int("c", 16, "concurrent requests")
	size := fs.Int("size", 0, "pad each document to about this many bytes (0: the usual order); 4 distinct bodies then")
	if err := fs.Parse(args); err != nil {
		return roleResult{}, err
	}
	type req struct {
		body []byte
		h    http.Header
	}
	k := min(*n, 10000)
	if *size > 0 {
		k = min(*n, 4) // large bodies: a few, reused (the receiver counts them all)
	}
	reqs := make([]req, k)
	ts := time.Now()
	for i := range reqs {
		change := syntheticChange(i)
		if *size > 0 {
			change = syntheticLargeChange(i, *size)
		}
		ev, err := event.FromChange("orders", uint64(i), change)
		if err != nil {
			return roleResult{}, err
		}
		ev.Rules = []string{"all"}
		body, err := ev.Envelope(false)
		if err != nil {
			return roleResult{}, err
		}
		sig, err := webhook.Sign([]string{benchSecret}, ev.ID, ts, body)
		if err != nil {
			return roleResult{}, err
		}
		reqs[i] = req{body: body, h: http.Header{
			"Content-Type":          {"application/json"},
			"User-Agent":            {"changegate-bench"},
			webhook.HeaderID:        {ev.ID},
			webhook.HeaderTimestamp: {strconv.FormatInt(ts.Unix(), 10)},
			webhook.HeaderSignature: {sig},
		}}
	}
	hc := poster(*c)
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	t0, c0 := time.Now(), selfCPU()
	for w := 0; w < *c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= *n || firstErr.Load() != nil {
					return
				}
				r := reqs[i%k]
				if err := post(hc, *url, r.body, r.h); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	res := roleResult{Events: *n, Elapsed: time.Since(t0), CPU: selfCPU() - c0}
	if p := firstErr.Load(); p != nil {
		return res, *p
	}
	return res, nil
}

// roleMinimal is the least a consumer does to deliver what changegate
// delivers, and nothing more: it reads the stream, copies each change out of
// the driver's buffer, decodes it (event.FromChange), encodes its envelope,
// signs it and POSTs it (or -batch envelopes as one array) from c concurrent
// workers. No ordering, no checkpoints, no retries, no limit, no byte budget:
// changegate's CPU above this consumer's is the cost of its guarantees.
func roleMinimal(args []string) (roleResult, error) {
	fs := flag.NewFlagSet("minimal", flag.ContinueOnError)
	var sf streamFlags
	sf.register(fs)
	url := fs.String("url", "", "receiver URL")
	c := fs.Int("c", 16, "concurrent requests")
	batch := fs.Int("batch", 1, "envelopes per request")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the consumer to this file (-profile: the same profile as changegate's, for a differential)")
	ctx := context.Background()
	cs, err := sf.open(ctx, fs, args)
	if err != nil {
		return roleResult{}, err
	}
	defer cs.close(ctx)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return roleResult{}, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return roleResult{}, err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	key, err := webhook.DecodeSecret(benchSecret)
	if err != nil {
		return roleResult{}, err
	}
	type req struct {
		id   string
		body []byte
	}
	reqs := make(chan req, *c)
	hc := poster(*c)
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	for w := 0; w < *c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mac := hmac.New(sha256.New, key)
			for r := range reqs {
				if firstErr.Load() != nil {
					continue // drain
				}
				ts := strconv.FormatInt(time.Now().Unix(), 10)
				h := http.Header{
					"Content-Type":          {"application/json"},
					"User-Agent":            {"changegate-bench"},
					webhook.HeaderID:        {r.id},
					webhook.HeaderTimestamp: {ts},
					webhook.HeaderSignature: {minimalSign(mac, r.id, ts, r.body)},
				}
				if err := post(hc, *url, r.body, h); err != nil {
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	var t0 time.Time
	var c0 time.Duration
	var ids []string
	var envs [][]byte
	send := func() {
		if len(envs) == 1 {
			reqs <- req{id: ids[0], body: envs[0]}
		} else {
			n := len(envs) + 1 // brackets and commas
			for _, e := range envs {
				n += len(e)
			}
			body := append(make([]byte, 0, n), '[')
			for i, e := range envs {
				if i > 0 {
					body = append(body, ',')
				}
				body = append(body, e...)
			}
			reqs <- req{id: webhook.BatchID(ids), body: append(body, ']')}
		}
		ids, envs = ids[:0], envs[:0]
	}
	rules := []string{"all"} // shared, as a lane's events share their rule list
	read := func() error {
		for i := 0; i < sf.n; i++ {
			if !cs.Next(ctx) {
				return fmt.Errorf("stream ended after %d events: %v", i, cs.Err())
			}
			if i == 0 {
				t0, c0 = time.Now(), selfCPU()
			}
			ev, err := event.FromChange("orders", uint64(i), bytes.Clone(cs.Current))
			if err != nil {
				return err
			}
			ev.Rules = rules
			body, err := ev.Envelope(false)
			if err != nil {
				return err
			}
			ids, envs = append(ids, ev.ID), append(envs, body)
			if len(envs) == *batch || i == sf.n-1 {
				send()
			}
		}
		return nil
	}
	err = read()
	close(reqs)
	wg.Wait()
	res := roleResult{Events: sf.n, Elapsed: time.Since(t0), CPU: selfCPU() - c0}
	if err == nil {
		if p := firstErr.Load(); p != nil {
			err = *p
		}
	}
	return res, err
}

// minimalSign is the webhook-signature value of one secret (Standard
// Webhooks v1: base64 HMAC-SHA256 of "id.timestamp.body"), as changegate
// signs, with the worker's HMAC state reused.
func minimalSign(mac hash.Hash, id, ts string, body []byte) string {
	mac.Reset()
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// poster is the HTTP client of the baselines: c keep-alive connections.
func poster(c int) *http.Client {
	tr := &http.Transport{MaxIdleConns: c, MaxIdleConnsPerHost: c, DisableCompression: true}
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

// post POSTs body with headers h, reads the answer to its end and returns an
// error unless it is a 2xx.
func post(hc *http.Client, url string, body []byte, h http.Header) error {
	hr, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hr.Header = h
	resp, err := hc.Do(hr)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errors.New(resp.Status)
	}
	return nil
}

// syntheticLargeChange is syntheticChange with the document padded to
// about size bytes (scenario 14's ceiling).
func syntheticLargeChange(i, size int) bson.Raw {
	tok := bson.D{{Key: "_data", Value: fmt.Sprintf("8266%024X", i)}}
	b, _ := bson.Marshal(bson.D{
		{Key: "_id", Value: tok},
		{Key: "operationType", Value: "insert"},
		{Key: "clusterTime", Value: bson.Timestamp{T: uint32(time.Now().Unix()), I: uint32(i + 1)}},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(time.Now())},
		{Key: "fullDocument", Value: largeDoc(i, 0, size)},
		{Key: "ns", Value: bson.D{{Key: "db", Value: benchDB}, {Key: "coll", Value: benchColl}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: int32(i)}}},
	})
	return b
}

// syntheticChange returns an insert change event shaped like the ones
// mongowire produces for the benchmark's documents.
func syntheticChange(i int) bson.Raw {
	tok := bson.D{{Key: "_data", Value: fmt.Sprintf("8266%024X", i)}}
	b, _ := bson.Marshal(bson.D{
		{Key: "_id", Value: tok},
		{Key: "operationType", Value: "insert"},
		{Key: "clusterTime", Value: bson.Timestamp{T: uint32(time.Now().Unix()), I: uint32(i + 1)}},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(time.Now())},
		{Key: "fullDocument", Value: benchDoc(i, 0)},
		{Key: "ns", Value: bson.D{{Key: "db", Value: benchDB}, {Key: "coll", Value: benchColl}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: int32(i)}}},
	})
	return b
}

// roleGateway runs changegate in this process (what cmd/changegate run
// does) until SIGTERM or SIGINT, optionally with CPU and allocation
// profiles, or, with -no-pushdown, with the rule filters evaluated only
// client-side.
func roleGateway(args []string) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	path := fs.String("config", "", "config file")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file")
	memProfile := fs.String("memprofile", "", "write an allocation profile to this file")
	noPushdown := fs.Bool("no-pushdown", false, "do not push rule filters down into the change stream")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if *memProfile != "" {
		runtime.MemProfileRate = 64 << 10
		defer func() {
			f, err := os.Create(*memProfile)
			if err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Tracing from OTEL_* as cmd/changegate sets it up (-otlp).
	tracer, err := tracing.FromEnv(ctx, "bench", os.Stdout)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tracer.Shutdown(sctx)
	}()
	return app.Run(ctx, cfg, app.Options{Logger: log, NoPushdown: *noPushdown, Tracer: tracer})
}
