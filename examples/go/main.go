// Ask Floodgate before a call, report after: Go with grpc-go. Generate the
// stubs first (see buf.gen.yaml), then: go run . -server 127.0.0.1:50051
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	floodgatev1 "github.com/floodgate-rs/floodgate/examples/go/gen/floodgate/v1"
)

// Denied: the call was not made.
type Denied struct {
	Verdict    floodgatev1.Verdict
	RetryAfter time.Duration
	Reason     string
}

func (d *Denied) Error() string { return d.Reason }

// Guard asks before a call and reports after; FailOpen decides when the
// server does not answer within Deadline.
type Guard struct {
	Client   floodgatev1.FloodgateClient
	FailOpen bool
	Deadline time.Duration
}

func (g *Guard) Call(ctx context.Context, resource string, descriptors map[string]string, call func(context.Context) error) error {
	ask, cancel := context.WithTimeout(ctx, g.Deadline)
	defer cancel()
	d, err := g.Client.Acquire(ask, &floodgatev1.AcquireRequest{Resource: resource, Descriptors: descriptors, Cost: 1})
	if err != nil {
		if status.Code(err) == codes.InvalidArgument {
			return err // our bug: the message names the field
		}
		if g.FailOpen {
			return call(ctx)
		}
		return &Denied{Verdict: floodgatev1.Verdict_VERDICT_UNSPECIFIED, RetryAfter: time.Second, Reason: "floodgate unavailable: " + err.Error()}
	}
	if d.GetVerdict() != floodgatev1.Verdict_VERDICT_ALLOWED {
		return &Denied{Verdict: d.GetVerdict(), RetryAfter: d.GetRetryAfter().AsDuration(), Reason: d.GetReason()}
	}
	if w := d.GetWait().AsDuration(); w > 0 {
		time.Sleep(w) // shaping
	}
	callErr := call(ctx)
	if d.GetPermitId() != "" {
		outcome := floodgatev1.Outcome_OUTCOME_SUCCESS
		if callErr != nil {
			outcome = floodgatev1.Outcome_OUTCOME_FAILURE
		}
		report, cancel := context.WithTimeout(context.Background(), g.Deadline)
		defer cancel()
		// Best effort: an unreported permit expires on the server by itself.
		_, _ = g.Client.ReportOutcome(report, &floodgatev1.ReportOutcomeRequest{Resource: resource, PermitId: d.GetPermitId(), Outcome: outcome})
	}
	return callErr
}

func main() {
	server := flag.String("server", "127.0.0.1:50051", "Floodgate's gRPC address")
	flag.Parse()
	conn, err := grpc.NewClient(*server, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	g := &Guard{Client: floodgatev1.NewFloodgateClient(conn), FailOpen: true, Deadline: 250 * time.Millisecond}
	for i := 0; i < 4; i++ {
		err := g.Call(context.Background(), "orders", map[string]string{"user": "u1"}, func(context.Context) error { return nil })
		var denied *Denied
		switch {
		case errors.As(err, &denied):
			fmt.Printf("%s, retry in %s: %s\n", denied.Verdict, denied.RetryAfter, denied.Reason)
		case err != nil:
			fmt.Println("error:", err)
		default:
			fmt.Println("VERDICT_ALLOWED")
		}
	}
}
