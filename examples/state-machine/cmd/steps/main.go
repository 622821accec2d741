// Command steps serves the state-machine example's step handlers over HTTP
// (POST /step1, /step2a, /step2b, /join, /review, /finish, /mark-failed),
// for changegate.toml's webhook sinks to call. See ../../README.md.
//
// Environment: MONGODB_URI, WEBHOOK_SECRET, JOBS_DB (default "app"),
// LISTEN (default "127.0.0.1:8080").
package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	statemachine "github.com/changegate/changegate/examples/state-machine"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("steps", "err", err)
		os.Exit(1)
	}
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	uri, secret := os.Getenv("MONGODB_URI"), os.Getenv("WEBHOOK_SECRET")
	if uri == "" || secret == "" {
		return errors.New("set MONGODB_URI and WEBHOOK_SECRET")
	}
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return err
	}
	defer client.Disconnect(context.Background())
	jobs := client.Database(getenv("JOBS_DB", "app")).Collection("jobs")
	h, err := statemachine.NewHandler(statemachine.NewWorkflow(jobs), log, secret)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: getenv("LISTEN", "127.0.0.1:8080"), Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("serving the steps", "addr", srv.Addr, "jobs", jobs.Database().Name()+".jobs")
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
