// Command receiver is a tiny webhook receiver for deploy/compose.yaml and
// manual testing: it verifies each request's Standard Webhooks signature
// with sinks/webhook.Verify and prints every verified envelope as one JSON
// line on stdout. It answers 204 to verified requests, 401 to requests whose
// signature does not verify and 400 to bodies that are not JSON envelopes.
// It is a test tool, not a production consumer.
//
//	receiver -listen :8080 -path /hook        (secrets from $WEBHOOK_SECRET)
//
// WEBHOOK_SECRET (or -secret) may hold several secrets separated by commas,
// as during a rotation; with none, signatures are not checked (a warning is
// logged at start).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/changegate/changegate/sinks/webhook"
)

func main() {
	listen := flag.String("listen", ":8080", "listen address")
	path := flag.String("path", "/hook", "URL path that accepts deliveries (POST)")
	secret := flag.String("secret", os.Getenv("WEBHOOK_SECRET"), "signing secret(s), comma separated (default $WEBHOOK_SECRET)")
	tolerance := flag.Duration("tolerance", 5*time.Minute, "accepted webhook-timestamp skew; 0 disables the check")
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	h := &handler{secrets: splitSecrets(*secret), tolerance: *tolerance, out: os.Stdout, log: log}
	if len(h.secrets) == 0 {
		log.Warn("no secret configured: signatures are NOT verified")
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+*path, h)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Info("receiver listening", "listen", *listen, "path", *path)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("receiver failed", "err", err)
		os.Exit(1)
	}
}

// splitSecrets splits a comma-separated list, dropping blanks.
func splitSecrets(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// handler verifies and prints deliveries.
type handler struct {
	secrets   []string
	tolerance time.Duration
	log       *slog.Logger

	mu  sync.Mutex // serialises writes to out
	out io.Writer
}

// maxBody bounds a request body (changegate batches are at most 1000 events).
const maxBody = 64 << 20

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := r.Header.Get(webhook.HeaderID)
	if len(h.secrets) > 0 {
		if err := webhook.Verify(h.secrets, r.Header, body, h.tolerance, time.Now()); err != nil {
			h.log.Warn("signature rejected", "webhook_id", id, "err", err)
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
	}
	var envs []json.RawMessage
	if len(body) > 0 && body[0] == '[' {
		err = json.Unmarshal(body, &envs)
	} else {
		var env json.RawMessage
		err = json.Unmarshal(body, &env)
		envs = []json.RawMessage{env}
	}
	if err != nil {
		http.Error(w, "bad json: "+err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, env := range envs {
		line, err := json.Marshal(struct {
			WebhookID string          `json:"webhook_id"`
			Envelope  json.RawMessage `json:"envelope"`
		}{id, env})
		if err != nil { // not reachable: env is valid JSON
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(h.out, "%s\n", line)
	}
	w.WriteHeader(http.StatusNoContent)
}
