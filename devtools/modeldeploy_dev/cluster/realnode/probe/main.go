// probe: the test workload of the real node, a static binary in a one-layer image (build-node.sh).
//
//	probe serve ADDR   HTTP server: GET / answers "<hostname> <remote address>"
//	probe get URL [CA] one HTTP GET; prints the body, exits non-zero unless the status is 200;
//	                   with CA (a PEM file), https is verified against it alone
//
// Used to show, without any registry outside this machine, that pods get addresses on the node's
// bridge and that ClusterIP Services work from pods and from the host.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 3 || len(os.Args) > 4 {
		fmt.Fprintln(os.Stderr, "usage: probe serve ADDR | probe get URL [CA]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2])
	case "get":
		ca := ""
		if len(os.Args) == 4 {
			ca = os.Args[3]
		}
		os.Exit(get(os.Args[2], ca))
	default:
		fmt.Fprintf(os.Stderr, "probe: unknown command %q (serve | get)\n", os.Args[1])
		os.Exit(2)
	}
}

func serve(addr string) {
	host, _ := os.Hostname()
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", host, r.RemoteAddr)
	})
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		srv.Close()
	}()
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func get(url, ca string) int {
	c := &http.Client{Timeout: 10 * time.Second}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			fmt.Fprintln(os.Stderr, "probe:", err)
			return 1
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fmt.Fprintln(os.Stderr, "probe: no certificate in", ca)
			return 1
		}
		c.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	}
	r, err := c.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 1
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	fmt.Print(string(body))
	if r.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, "probe: status", r.StatusCode)
		return 1
	}
	return 0
}
