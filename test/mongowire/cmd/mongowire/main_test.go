package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"-listen", "127.0.0.1:0", "-oplog-max-entries", "100"}, pw)
		_ = pw.Close()
	}()
	go func() { <-ctx.Done(); _ = pw.Close() }()

	var uri string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "mongowire: serving "); ok {
			uri = u
			break
		}
	}
	if uri == "" {
		t.Fatal("no URI reported")
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(ctx)
	if _, err := client.Database("app").Collection("c").InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("run did not return after cancel")
	}
}
