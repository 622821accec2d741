package mongowire_test

import (
	"context"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongowire"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// startServer starts a server closed at the end of the test.
func startServer(t testing.TB, opts mongowire.Options) *mongowire.Server {
	t.Helper()
	srv, err := mongowire.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// connect returns a driver client for uri, disconnected at the end of the test.
func connect(t testing.TB, uri string, extra ...func(*options.ClientOptions)) *mongo.Client {
	t.Helper()
	o := options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second)
	for _, f := range extra {
		f(o)
	}
	client, err := mongo.Connect(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	return client
}

// ctxFor returns a context bounded by d and cancelled at the end of the test.
func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// setup starts a server and connects a client to it.
func setup(t testing.TB) (*mongowire.Server, *mongo.Client, context.Context) {
	t.Helper()
	srv := startServer(t, mongowire.Options{})
	return srv, connect(t, srv.URI()), ctxFor(t, 30*time.Second)
}
