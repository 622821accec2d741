// Command step is one step of the state-machine example
// (examples/state-machine) as an AWS Lambda function invoked by
// changegate's lambda sink: the payload is the event's envelope (a JSON array
// of envelopes with batch_size > 1).
//
// Environment: STEP (step1, step2a, step2b, join, review, finish or
// mark-failed), MONGODB_URI, JOBS_DB (default "app").
//
// Invoke it with invocation_type = "RequestResponse": a returned error is a
// function error, which changegate retries per the sink's retry policy and
// then dead-letters (the failure path of the example). A job the step refuses
// for good also returns an error; the dead letter is written once the retries
// are spent.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"slices"

	"github.com/aws/aws-lambda-go/lambda"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	statemachine "github.com/changegate/changegate/examples/state-machine"
	"github.com/changegate/changegate/receive"
)

func main() {
	step := os.Getenv("STEP")
	if !slices.Contains(statemachine.Steps, step) {
		log.Fatalf("STEP=%q: want one of %v", step, statemachine.Steps)
	}
	db := os.Getenv("JOBS_DB")
	if db == "" {
		db = "app"
	}
	// One client per execution environment, reused across invocations.
	client, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("MONGODB_URI")))
	if err != nil {
		log.Fatal(err)
	}
	wf := statemachine.NewWorkflow(client.Database(db).Collection("jobs"))
	lambda.Start(func(ctx context.Context, payload json.RawMessage) error {
		envs, err := receive.DecodeBatch(payload)
		if err != nil {
			return err // a function error: changegate retries, then dead-letters
		}
		var errs []error
		for i := range envs {
			// No webhook-id here: the envelope's id is the same stable
			// event id, the deduplication key.
			job, out, err := wf.Run(ctx, step, envs[i].ID, &envs[i])
			log.Printf("step %s job %s event %s: %s", step, job, envs[i].ID, out)
			if out == statemachine.Refused || out == statemachine.Failed {
				errs = append(errs, fmt.Errorf("event %s: %w", envs[i].ID, err))
			}
		}
		return errors.Join(errs...)
	})
}
