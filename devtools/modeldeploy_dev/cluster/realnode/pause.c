/* The sandbox ("pause") process of a pod on the real node: PID 1 of the pod, holding its
 * namespaces. It sleeps, reaps any zombie re-parented to it, and exits on SIGINT/SIGTERM.
 * Built static by build-node.sh (no libc in the image) and imported into containerd. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(128 + sig); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("modeldeploy pause " PAUSE_VERSION "\n");
    return 0;
  }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not PID 1, zombies are not mine to reap\n");
  struct sigaction term = {.sa_handler = stop}, chld = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &chld, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) pause();
}
