#include "app/app.h"

int main(int argc, char **argv)
{
    return pf_server_main(argc, argv);
}
