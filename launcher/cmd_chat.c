/* strata chat — the command-line chat with a running worker (frontend/chat.h). */
#include "frontend/chat.h"
#include "launcher/cmd.h"

static int run(int argc, char **argv)
{
    return chat_main("strata chat", argc, argv);
}

const struct strata_cmd strata_cmd_chat = {"chat", "chat with a running worker in the terminal",
                                           run};
