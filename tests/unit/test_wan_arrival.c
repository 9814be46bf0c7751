/* wan_last_arrival_ms (trainer/gateway/wan_accept.c): when a message's last bytes reached
 * the kernel, not when a thread got round to reading them. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../trainer/gateway/wan_link_internal.h"
#include "test.h"

TEST(wan_arrival_is_when_the_bytes_came_not_when_they_were_read)
{
    int lst = socket(AF_INET, SOCK_STREAM, 0), out = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(lst >= 0 && out >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ASSERT_OK(bind(lst, (struct sockaddr *)&a, sizeof a));
    ASSERT_OK(listen(lst, 1));
    ASSERT_OK(getsockname(lst, (struct sockaddr *)&a, &len));
    ASSERT_OK(connect(out, (struct sockaddr *)&a, sizeof a));
    int in = accept(lst, NULL, NULL);
    ASSERT(in >= 0);
    const int64_t sent = net_now_ms();
    ASSERT_EQ(write(out, "DONE", 4), 4);
    usleep(300 * 1000); /* the reader "waits for a CPU" */
    const int64_t read_at = net_now_ms();
    const int64_t arrived = wan_last_arrival_ms(in);
    /* Loopback delivers within the write; TCP_INFO counts in milliseconds (and jiffies). */
    ASSERT(arrived >= sent - 20);
    ASSERT_LT(arrived, sent + 150);
    ASSERT(read_at - arrived >= 150);
    char buf[4];
    ASSERT_EQ(read(in, buf, sizeof buf), 4);
    /* Not a TCP socket: now. */
    int p[2];
    ASSERT_OK(pipe(p));
    const int64_t before = net_now_ms();
    const int64_t now = wan_last_arrival_ms(p[0]);
    ASSERT(now >= before && now <= net_now_ms());
    close(p[0]), close(p[1]), close(in), close(out), close(lst);
}
