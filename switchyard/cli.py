def main():
    print("switchyard")
