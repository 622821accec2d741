package console

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/test/mongotest"
)

// Many concurrent reads of a large dead letter, through the console's page
// and the API together, hold at most api.MaxPayloads whole entries at once (the
// others wait for a turn); the page shows a cut of the entry with a link to
// the whole of it in the API, which returns it whole.
func TestConsoleEntryReadsBounded(t *testing.T) {
	uri, _ := mongotest.URI(t)
	client := mongotest.Client(t, uri)
	state := mongotest.UniqueName("cgconsole_")
	t.Cleanup(func() { _ = client.Database(state).Drop(context.Background()) })
	dls := deadletter.NewStore(client.Database(state), "deadletters")
	big := strings.Repeat("x", 6<<20+512<<10) // 6.5 MiB
	change, _ := bson.Marshal(bson.D{{Key: "operationType", Value: "insert"}, {Key: "fullDocument", Value: bson.D{{Key: "_id", Value: 1}, {Key: "blob", Value: big}}}})
	key, _ := bson.Marshal(bson.D{{Key: "_id", Value: 1}})
	ent := deadletter.Entry{ID: deadletter.EntryID("items:01", "hook"), Kind: deadletter.KindFailed, EventID: "items:01", Source: "items", Sink: "hook",
		Operation: "insert", DocumentKey: key, Change: change, Reason: "http_400", LastError: "x", Attempts: 1,
		FirstFailedAt: time.Now(), LastFailedAt: time.Now()}
	if err := dls.Put(context.Background(), ent); err != nil {
		t.Fatal(err)
	}

	gw := fixedGateway{cfg: &config.Config{Server: config.Server{Console: true, PublicRead: true}}}
	admin := api.New(api.Options{Gateway: gw, DeadLetters: dls})
	New(admin, Options{Gateway: gw, DeadLetters: dls})
	payloads := admin.Payloads()
	release := make(chan struct{})
	payloads.Held = func() { <-release }
	srv := httptest.NewServer(admin)
	t.Cleanup(srv.Close)

	const pages, apis = 12, 4
	type result struct {
		path string
		code int
		body string
	}
	results := make(chan result, pages+apis)
	var wg sync.WaitGroup
	for i := range pages + apis {
		path := "/ui/deadletters/" + ent.ID
		if i >= pages {
			path = "/api/v1/deadletters/" + ent.ID
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				results <- result{path, 0, err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- result{path, resp.StatusCode, string(b)}
		}()
	}
	// Every request arrives: api.MaxPayloads hold an entry, the rest wait.
	deadline := time.Now().Add(30 * time.Second)
	for {
		inside, waiting, _ := payloads.Counts()
		if inside == api.MaxPayloads && waiting == pages+apis-api.MaxPayloads {
			break
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("%d reads hold an entry and %d wait, want %d and %d", inside, waiting, api.MaxPayloads, pages+apis-api.MaxPayloads)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(results)
	if _, _, most := payloads.Counts(); most != api.MaxPayloads {
		t.Errorf("at most %d entries held at once, want %d", most, api.MaxPayloads)
	}
	for r := range results {
		switch {
		case r.code != http.StatusOK:
			t.Errorf("GET %s: %d %.300s", r.path, r.code, r.body)
		case strings.HasPrefix(r.path, "/ui/"):
			if len(r.body) > consoleShownBytes+32<<10 || !strings.Contains(r.body, `id="entry-cut"`) ||
				!strings.Contains(r.body, `href="/api/v1/deadletters/`+url.PathEscape(ent.ID)+`"`) {
				t.Errorf("console page of %d bytes: want the entry cut at %d bytes and a link to the API: %s", len(r.body), consoleShownBytes, r.body[max(0, strings.Index(r.body, `id="entry-cut"`)):])
			}
		default:
			if len(r.body) < len(big) {
				t.Errorf("API reply of %d bytes: want the whole entry", len(r.body))
			}
		}
	}
}

// fixedGateway is a gateway with a fixed configuration and nothing
// running.
type fixedGateway struct{ cfg *config.Config }

func (g fixedGateway) Config() *config.Config { return g.cfg }

func (fixedGateway) Status() api.Status { return api.Status{Ready: true} }

func (fixedGateway) Reload() error { return nil }

func (fixedGateway) Replay(context.Context, deadletter.Filter, bool) (deadletter.ReplayResult, error) {
	return deadletter.ReplayResult{}, nil
}

func (fixedGateway) Pushdowns() (map[string]bson.D, bool) { return nil, false }
